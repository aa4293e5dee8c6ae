"""Running a program compiled over symbolic sizes (ir/sym.py) at whatever sizes a call brings.

The kernels read the sizes at run time (`vf_s0` from the seeds array), so one library serves
every size its guards admit. Per call: the symbols' values are read from the input shapes
(`SizeBinding`s), checked against the guards the compilation took (one generated Python
function) at a size not seen yet, and the call runs on the executor of those sizes
(`NativeSizes`: the first size's executor with the new output shapes and arena layout, the
same library, the sizes in its seeds array; no compiler). An executor is made once per size
and kept; all sizes share one arena (grown to the largest size seen) and one output pool.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from vfuse.codegen.cpp.gemm.prepack import prepack_layout
from vfuse.errors import VfuseInputError
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Graph, TensorType
from vfuse.ir.ops import Attrs
from vfuse.ir.sym import SymEnv, SymSize, is_sym, pretty, python
from vfuse.runtime.native import NativeExecutor
from vfuse.runtime.pool import OutputPool
from vfuse.schedule import BufKind, Program, TorchStep

MAX_EXECUTORS = 64  # sizes kept per program (least recently made dropped first)


@dataclass(frozen=True, slots=True)
class SizeBinding:
    """Symbol `name` is the size at `dim` of graph input `index` (dim -1: the argument is the size)."""

    name: str
    index: int
    dim: int


def bindings_of(graph: Graph, env: SymEnv) -> list[SizeBinding]:
    """Where each symbol is read: its size argument (Dynamo passes the sizes it lifted as ints:
    `a[0]` costs a fifth of `a[2].shape[0]`), else its first bare occurrence among the graph's
    tensor inputs. Tensors that disagree with the sizes read are refused by `consistent`."""
    found = {name: SizeBinding(name, index, -1) for name, index in env.arguments.items()}
    for n in graph.inputs:
        if isinstance(n.type, TensorType):
            for d, size in enumerate(n.type.shape):
                if isinstance(size, SymSize) and size.expr.is_Symbol:
                    found.setdefault(size.expr.name, SizeBinding(size.expr.name, int(n.attrs["index"]), d))
    missing = [s.name for s in env.symbols if s.name not in found]
    if missing:
        raise ValueError(f"symbols {missing} are no input's size: the graph is compiled per shape")
    return [found[s.name] for s in env.symbols]


def guard_function(env: SymEnv, names: Sequence[str]) -> Callable[..., bool]:
    """`f(*values) -> bool`: whether every guard holds at these symbol values (compiled once)."""
    conds = [_py_cond(g) for g in env.guards] or ["True"]
    src = f"def guards({', '.join(names) or '_unused=None'}):\n    return " + " and ".join(f"({c})" for c in conds)
    scope: dict[str, Any] = {}
    exec(compile(src, "<vfuse guards>", "exec"), scope)
    return scope["guards"]


def consistency_function(graph: Graph, names: Sequence[str]) -> Callable[..., bool]:
    """`f(inputs, *values) -> bool`: whether every symbolic dim of every tensor input equals its
    expression at the sizes read (a kernel trusts them: a tensor shorter than its symbol says
    would be read past its end). Dynamo's guards ensure it; a direct call is checked by this."""
    conds = [
        f"a[{int(n.attrs['index'])}].shape[{d}] == ({python(size.expr)})"
        for n in graph.inputs
        if isinstance(n.type, TensorType)
        for d, size in enumerate(n.type.shape)
        if isinstance(size, SymSize)
    ]
    src = f"def consistent(a, {', '.join(names) or '_unused=None'}):\n    return " + (" and ".join(conds) or "True")
    scope: dict[str, Any] = {}
    exec(compile(src, "<vfuse size consistency>", "exec"), scope)
    return scope["consistent"]


def _py_cond(c: sympy.Basic) -> str:
    if isinstance(c, sympy.Not):
        return f"not ({_py_cond(c.args[0])})"
    if isinstance(c, sympy.And | sympy.Or):
        op = " and " if isinstance(c, sympy.And) else " or "
        return op.join(f"({_py_cond(a)})" for a in c.args)
    if isinstance(c, sympy.Rel):
        return f"{python(c.lhs)} {c.rel_op} {python(c.rhs)}"
    raise TypeError(f"no printer for guard {c}")


def concretize(obj: Any, values: Mapping[sympy.Symbol, int], keep: tuple[type, ...] = ()) -> Any:
    """`obj` (plan, Program, graph, attrs: frozen dataclasses, tuples, dicts) with every SymSize
    replaced by its value; unchanged parts are shared, not copied; instances of `keep` are left
    as they are (kernels: their code reads the sizes itself, the runtime only names them).
    Substituting the same object at many sizes: `Substitution` (walks it once)."""
    sub = Substitution(obj, keep)
    return sub(tuple(values[s] for s in sub.symbols))


class Substitution:
    """`sub(values) -> obj` at those symbol values (`symbols` order), compiled once for `obj`:
    the walk that finds the sizes is done here, every expression is evaluated by one generated
    Python function, and a call rebuilds only the objects with a size inside (a new size's
    executor is made in ~0.1 ms; walking the objects per size took ~0.4 ms for BERT)."""

    def __init__(self, obj: Any, keep: tuple[type, ...] = (), symbols: tuple[sympy.Symbol, ...] = ()) -> None:
        self.obj = obj
        self.symbols = symbols  # the order of `values`; by default the first size's env's
        self._keep = keep
        self._exprs: dict[sympy.Basic, int] = {}
        # By id, with the object kept alive (an id is unique only while its object lives).
        self._built: dict[int, tuple[Any, Callable[[tuple[int, ...]], Any] | None]] = {}
        self._build = self._compile(obj)
        names = ", ".join(s.name for s in self.symbols) or "_unused=None"
        exprs = "".join(f"{python(e)}, " for e in self._exprs)
        self._eval: Callable[..., tuple[int, ...]] = eval(f"lambda {names}: ({exprs})")

    def __call__(self, values: Sequence[int]) -> Any:
        if self._build is None:
            return self.obj
        return self._build(self._eval(*values))

    def _compile(self, x: Any) -> Callable[[tuple[int, ...]], Any] | None:
        """A function rebuilding `x` from the expressions' values, or None where `x` has no size."""
        t = type(x)
        if t in _ATOMS or isinstance(x, enum.Enum | torch.Tensor) or isinstance(x, self._keep):
            return None
        if t is SymSize:
            if not self.symbols:
                self.symbols = x.env.symbols
            k = self._exprs.setdefault(x.expr, len(self._exprs))
            return lambda v: int(v[k])
        key = id(x)
        if key not in self._built:
            self._built[key] = (x, self._compile_container(x))
        return self._built[key][1]

    def _compile_container(self, x: Any) -> Callable[[tuple[int, ...]], Any] | None:
        if isinstance(x, tuple | list | frozenset | set):
            parts = [(self._compile(v), v) for v in x]
            if all(f is None for f, _ in parts):
                return None
            make = (lambda it: type(x)(*it)) if hasattr(x, "_fields") else type(x)
            return lambda v: make([f(v) if f else c for f, c in parts])
        if isinstance(x, dict):
            entries = [(self._compile(k), k, self._compile(w), w) for k, w in x.items()]
            if all(fk is None and fw is None for fk, _, fw, _ in entries):
                return None
            make_dict = type(x) if type(x) is dict else dict
            return lambda v: make_dict((fk(v) if fk else k, fw(v) if fw else w) for fk, k, fw, w in entries)
        if isinstance(x, Attrs):
            items = self._compile(x.items_)
            return None if items is None else lambda v: Attrs(items(v))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            fields = [f.name for f in dataclasses.fields(x) if f.init]
            parts_ = [(n, self._compile(getattr(x, n))) for n in fields]
            sized = [(n, f) for n, f in parts_ if f is not None]
            if not sized:
                return None
            fixed = {n: getattr(x, n) for n, f in parts_ if f is None}
            cls = type(x)
            return lambda v: cls(**fixed, **{n: f(v) for n, f in sized})
        return None


_ATOMS = {int, float, str, bool, type(None), bytes, complex}


class NativeSizes:
    """`make(values)`: the NativeExecutor of a symbolic Program (built once) at those sizes.
    All sizes share one output pool (a buffer of a larger size serves a smaller one). On the
    lean path (`callplan.py`) a size after the first is a copy of the first size's executor
    with its output shapes and arena layout (one generated function evaluates them): ~10 us
    where substituting the sizes into the Program and building an executor took ~0.3 ms (BERT);
    the Program at those sizes is substituted only if something reads it."""

    def __init__(self, program: Program, plan: FusionPlan, symbols: tuple[sympy.Symbol, ...], **native: Any) -> None:
        self._program, self._plan, self._native = program, plan, native
        # Substitutions walk their objects once: a new size only evaluates and rebuilds.
        self._sized = Substitution((program.buffers, program.memory), symbols=symbols)
        graph = plan.graph
        torch_run = {n for s in program.steps if isinstance(s, TorchStep) for n in s.nodes}
        # The graph's nodes only where torch runs some of them (the whole graph took milliseconds per size).
        self._torch_nodes = Substitution(tuple(n for n in graph.nodes if n.name in torch_run), symbols=symbols)
        self._torch_run = bool(torch_run)
        outputs = tuple(b.type.shape for b in program.buffers.values() if b.kind is BufKind.OUTPUT)
        self._facts = Substitution((outputs, prepack_layout(program)[1:]), symbols=symbols)
        self._pool = OutputPool()
        self._first: NativeExecutor | None = None

    def __call__(self, values: tuple[int, ...]) -> NativeExecutor:
        first = self._first
        if first is not None and first.call_plan is not None:
            shapes, layout = self._facts(values)
            return first.at_sizes(values, lambda: self.program(values), shapes, layout)
        plan = self._plan
        if self._torch_run:  # only the nodes torch runs are substituted
            graph = plan.graph
            by_name = {n.name: n for n in self._torch_nodes(values)}
            plan = dataclasses.replace(
                plan, graph=Graph(tuple(by_name.get(n.name, n) for n in graph.nodes), graph.outputs)
            )
        ex = NativeExecutor(plan, self.program(values), sizes=values, pool=self._pool, **self._native)
        self._first = self._first or ex
        return ex

    def program(self, values: tuple[int, ...]) -> Program:
        """The Program with the sizes `values` substituted (buffers and arena)."""
        buffers, memory = self._sized(values)
        return dataclasses.replace(self._program, buffers=buffers, memory=memory)


class SymbolicExecutor:
    """The executor of a program compiled over symbolic sizes: one concrete executor per size,
    made on demand by `make(values)` (in `env.symbols` order) from the same built library."""

    def __init__(
        self,
        graph: Graph,
        env: SymEnv,
        make: Callable[[tuple[int, ...]], Any],
        stats: Any,
        program: Any = None,
        source: str | None = None,
    ) -> None:
        self.env = env
        self.program = program  # the symbolic Program (None for the reference executor)
        self.source = source  # its C++ (kept with the program: entry/warm_program.py)
        self.bindings = bindings_of(graph, env)
        self.names = [b.name for b in self.bindings]
        self.guards = guard_function(env, self.names)
        self.consistent = consistency_function(graph, self.names)
        self._graph = graph
        self._make = make
        self.read = _reader(self.bindings)  # inputs -> values, unchecked (Dynamo's guards hold)
        self._by_size: dict[tuple[int, ...], Any] = {}  # the executor of each size made
        # The call of each size made: callers that read the sizes themselves look their call up
        # here (entry/dynamic.py: one dict lookup per call); sizes dropped leave it too.
        self.runs: dict[tuple[int, ...], Callable[[list[torch.Tensor]], list[torch.Tensor]]] = {}
        self._lock = threading.RLock()
        self._arena: torch.Tensor | None = None
        self._arena_bytes = 0
        self.stats = stats
        self.instantiated = 0  # sizes an executor was made for

    def values(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        try:
            return self.read(inputs)
        except (IndexError, AttributeError, TypeError) as e:
            raise VfuseInputError(f"a compiled graph with symbolic sizes could not read its sizes: {e}") from None

    def check(self, inputs: Sequence[Any]) -> None:
        """Raise VfuseInputError naming the first tensor dim that disagrees with the sizes read
        (for callers without Dynamo's guards: `CompiledGraph.check_inputs`)."""
        values = self.values(inputs)
        if self.consistent(inputs, *values):
            return
        at = dict(zip(self.names, values))
        for n in self._graph.inputs:
            if not isinstance(n.type, TensorType):
                continue
            i = int(n.attrs["index"])
            for d, size in enumerate(n.type.shape):
                want = int(size.expr.subs({s: at[s.name] for s in size.expr.free_symbols})) if is_sym(size) else size
                if inputs[i].shape[d] != want:
                    raise VfuseInputError(
                        f"input {i} ({n.name}) has size {inputs[i].shape[d]} at dim {d}, where the sizes read "
                        f"({', '.join(f'{k}={v}' for k, v in at.items())}) give {pretty(size)} = {want}"
                    )
        raise VfuseInputError(f"input shapes disagree with the sizes read ({at})")

    def serves(self, values: tuple[int, ...]) -> bool:
        return values in self.runs or bool(self.guards(*values))

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.run(self.values(inputs), inputs)

    def run(self, values: tuple[int, ...], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """A call whose sizes the caller has read already (`values`)."""
        run = self.runs.get(values)
        if run is None:
            self.executor_for(values)
            run = self.runs[values]
        return run(inputs)

    def executor_for(self, values: tuple[int, ...]) -> Any:
        if not self.guards(*values):
            sizes = ", ".join(f"{n}={v}" for n, v in zip(self.names, values))
            raise VfuseInputError(f"sizes {sizes} are outside what this program was compiled for")
        with self._lock:
            ex = self._by_size.get(values)
            if ex is None:
                if len(self._by_size) >= MAX_EXECUTORS:
                    old = next(iter(self._by_size))
                    del self._by_size[old], self.runs[old]
                ex = self._by_size[values] = self._make(values)
                self.runs[values] = self._runner(ex)
                self.instantiated += 1
        return ex

    def _runner(self, ex: Any) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """The call of one size's executor, what does not change per call bound once. Executors
        with an arena share one, grown to the largest size seen (never reallocated for a size
        seen before). Once bound to it, a lean executor's calls go straight to its lean path."""
        if not hasattr(ex, "call_on"):
            return ex
        need, lock, call = ex.arena_bytes(), self._lock, ex.call_on

        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            with lock:
                if ex._arena is self._arena and ex.lean is not None:  # bound to it, set up, lean
                    return ex.lean(inputs)
                if self._arena_bytes < need:
                    self._arena, self._arena_bytes = torch.empty(need, dtype=torch.uint8), need
                return call(self._arena, inputs)

        return run


def _reader(bindings: Sequence[SizeBinding]) -> Callable[[Sequence[Any]], tuple[int, ...]]:
    """`read(inputs) -> values`: one generated expression (the generic loop cost ~1 us a call)."""
    # Shape entries are ints already; size arguments are Dynamo's ints (int() cost ~70 ns each).
    parts = [f"a[{b.index}].shape[{b.dim}]" if b.dim >= 0 else f"a[{b.index}]" for b in bindings]
    return eval(f"lambda a: ({''.join(p + ', ' for p in parts)})")
