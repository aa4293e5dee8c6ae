"""Running a program compiled over symbolic sizes (ir/sym.py) at whatever sizes a call brings.

The kernels read the sizes at run time (`vf_s0` from the seeds array), so one library serves
every size its guards admit. Per call: the symbols' values are read from the input shapes
(`SizeBinding`s), checked against the guards the compilation took (one generated Python
function), and the call runs on the executor of those sizes: the plan and Program with every
size substituted (`concretize`), the same library, the sizes in its seeds array. An executor
is made once per size (a few ms, no compiler) and kept; the arena of each is its own, sized
for its sizes.
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

from vfuse.errors import VfuseInputError
from vfuse.ir import Graph, TensorType
from vfuse.ir.ops import Attrs
from vfuse.ir.sym import SymEnv, SymSize, python

MAX_EXECUTORS = 64  # sizes kept per program (least recently made dropped first)


@dataclass(frozen=True, slots=True)
class SizeBinding:
    """Symbol `name` is the size at `dim` of graph input `index` (dim -1: the argument is the size)."""

    name: str
    index: int
    dim: int


def bindings_of(graph: Graph, env: SymEnv) -> list[SizeBinding]:
    """Where each symbol is read: its first bare occurrence among the graph's tensor inputs."""
    found: dict[str, SizeBinding] = {}
    for n in graph.inputs:
        if isinstance(n.type, TensorType):
            for d, size in enumerate(n.type.shape):
                if isinstance(size, SymSize) and size.expr.is_Symbol:
                    found.setdefault(size.expr.name, SizeBinding(size.expr.name, int(n.attrs["index"]), d))
    for name, index in env.arguments.items():
        found.setdefault(name, SizeBinding(name, index, -1))
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
    as they are (kernels: their code reads the sizes itself, the runtime only names them)."""
    memo: dict[int, Any] = {}
    exprs: dict[sympy.Basic, int] = {}

    def size(x: SymSize) -> int:
        v = exprs.get(x.expr)
        if v is None:
            v = exprs[x.expr] = int(x.env.evaluator(x.expr)(*(values[s] for s in x.env.symbols)))
        return v

    def go(x: Any) -> Any:
        t = type(x)
        if t in _ATOMS or isinstance(x, enum.Enum | torch.Tensor) or isinstance(x, keep):
            return x
        if t is SymSize:
            return size(x)
        key = id(x)
        if key in memo:
            return memo[key]
        memo[key] = out = _rebuild(x, go)
        return out

    return go(obj)


_ATOMS = {int, float, str, bool, type(None), bytes, complex}


def _rebuild(x: Any, go: Callable[[Any], Any]) -> Any:
    if isinstance(x, tuple | list):
        new = [go(v) for v in x]
        if all(a is b for a, b in zip(new, x)):
            return x
        return type(x)(*new) if hasattr(x, "_fields") else type(x)(new)
    if isinstance(x, dict):
        items = [(go(k), go(v)) for k, v in x.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(items, x.items())):
            return x
        return type(x)(items) if type(x) is dict else dict(items)
    if isinstance(x, frozenset | set):
        new_set = [go(v) for v in x]
        return x if all(a is b for a, b in zip(new_set, x)) else type(x)(new_set)
    if isinstance(x, Attrs):
        items_ = go(x.items_)
        return x if items_ is x.items_ else Attrs(items_)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changed = {}
        for f in dataclasses.fields(x):
            if f.init:
                old = getattr(x, f.name)
                new = go(old)
                if new is not old:
                    changed[f.name] = new
        return dataclasses.replace(x, **changed) if changed else x
    return x


class SymbolicExecutor:
    """The executor of a program compiled over symbolic sizes: one concrete executor per size,
    made on demand by `make(values)` from the same built library."""

    def __init__(
        self,
        graph: Graph,
        env: SymEnv,
        make: Callable[[dict[sympy.Symbol, int]], Any],
        stats: Any,
        program: Any = None,
    ) -> None:
        self.env = env
        self.program = program  # the symbolic Program (None for the reference executor)
        self.bindings = bindings_of(graph, env)
        self.names = [b.name for b in self.bindings]
        self.guards = guard_function(env, self.names)
        self._make = make
        self._by_size: dict[tuple[int, ...], Any] = {}
        self._lock = threading.RLock()
        self._arena: torch.Tensor | None = None
        self.stats = stats
        self.instantiated = 0  # sizes an executor was made for

    def values(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        try:
            return tuple(
                int(inputs[b.index].shape[b.dim]) if b.dim >= 0 else int(inputs[b.index]) for b in self.bindings
            )
        except (IndexError, AttributeError, TypeError) as e:
            raise VfuseInputError(f"a compiled graph with symbolic sizes could not read its sizes: {e}") from None

    def serves(self, values: tuple[int, ...]) -> bool:
        return values in self._by_size or bool(self.guards(*values))

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.run(self.values(inputs), inputs)

    def run(self, values: tuple[int, ...], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """A call whose sizes the caller has read already (`values`). Executors with an arena
        share one, grown to the largest size seen (never reallocated for a size seen before)."""
        ex = self._by_size.get(values)
        if ex is None:
            ex = self.executor_for(values)
        if not hasattr(ex, "bind_arena"):
            return ex(inputs)
        with self._lock:
            need = ex.arena_bytes()
            if self._arena is None or self._arena.numel() < need:
                self._arena = torch.empty(need, dtype=torch.uint8)
            ex.bind_arena(self._arena)
            return ex(inputs)

    def executor_for(self, values: tuple[int, ...]) -> Any:
        if not self.guards(*values):
            sizes = ", ".join(f"{n}={v}" for n, v in zip(self.names, values))
            raise VfuseInputError(f"sizes {sizes} are outside what this program was compiled for")
        with self._lock:
            ex = self._by_size.get(values)
            if ex is None:
                if len(self._by_size) >= MAX_EXECUTORS:
                    self._by_size.pop(next(iter(self._by_size)))
                by_symbol = {s: v for s, v in zip(self.env.symbols, values)}
                ex = self._by_size[values] = self._make(by_symbol)
                self.instantiated += 1
        return ex
