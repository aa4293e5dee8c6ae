"""Graphs with symbolic sizes (torch.compile(dynamic=True), automatic dynamic, mark_dynamic,
export with Dim): compiled once over their symbols, run at every size the program's guards admit.

`Dynamic` is what AOTAutograd gets for such a graph. Its first call compiles the graph with the
call's sizes as hints (`frontend.symbols.sym_env`, `compiler.compile_fx(symbols=...)`): one
library whose kernels read the sizes at run time. A later call at sizes the guards admit runs
it (a new size only substitutes its sizes into the plan: no compiler); sizes outside them
compile another variant (the guards name what the program specialized on: a row width below
a threshold, a divisibility). A graph the symbolic path cannot compile (a symbol no input
carries, a template that needs constant sizes) is compiled per shape instead, as before.
Non-tensor outputs (sizes a training forward saves for its backward, a KV-cache length) are
computed from the symbols.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from vfuse.entry.outputs import COMPUTED, without_none_outputs
from vfuse.errors import VfuseCodegenError
from vfuse.frontend.symbols import sym_env
from vfuse.ir.sym import python
from vfuse.runtime.symbolic import MAX_EXECUTORS, SymbolicExecutor

MAX_VARIANTS = 8  # programs per graph before it is compiled per shape


class SizeOutput:
    """An output slot holding a size: an expression over the symbols, evaluated per call."""

    def __init__(self, expr: sympy.Basic, names: Sequence[str]) -> None:
        self.expr = expr
        self.fn = eval(f"lambda {', '.join(names) or '_=None'}: {python(expr)}")

    def __repr__(self) -> str:
        return f"SIZE({self.expr})"


class AliasOutput:
    """An output slot holding a view of an input (`x[a:b]`, `x.expand_as(y)`): made per call by
    torch on the call's own input, so it aliases it as the graph says. AOTAutograd rebuilds
    such an output from the compiled one's strides and offset when the view has symbolic
    arguments, and a kernel's fresh output has neither (it read row 0 for `x[1:3:2]`)."""

    def __init__(self, index: int) -> None:
        self.index = index  # position in the alias module's outputs

    def __repr__(self) -> str:
        return f"ALIAS({self.index})"


def _aliases_input(node: Any) -> bool:
    """Whether a graph output is an input or a chain of view ops over one."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        target = node.target
        if not (isinstance(target, torch._ops.OpOverload) and target.is_view) or not node.args:
            return False
        node = node.args[0]
    return (
        isinstance(node, torch.fx.Node) and node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)
    )


def alias_module(gm: torch.fx.GraphModule, outputs: list[Any]) -> torch.fx.GraphModule:
    """A module computing `outputs` (views of inputs, and the sizes they use) from all of `gm`'s arguments."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    needed: set[torch.fx.Node] = set()
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if isinstance(n, torch.fx.Node) and n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in needed:
            env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(tuple(env[o] for o in outputs))
    return torch.fx.GraphModule(gm, graph)


def size_slots(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple[Any, ...], Any]:
    """`gm` without its non-tensor outputs and views of inputs, the slots (COMPUTED, a constant,
    a SymInt's value, an AliasOutput) to put them back, and the module making the views (or None)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0]
    aliases: list[Any] = []
    if isinstance(values, list | tuple):
        sym: list[Any] = []
        for v in values:
            if _symint(v) is not None:
                sym.append(_symint(v))
            elif isinstance(v, torch.fx.Node) and _aliases_input(v):
                sym.append(AliasOutput(len(aliases)))
                aliases.append(v)
            else:
                sym.append(None)
        if any(s is not None for s in sym):
            # A SymInt output is no tensor: replace it by None for without_none_outputs to drop.
            import copy

            graph = copy.deepcopy(gm.graph)
            new_out = next(n for n in graph.nodes if n.op == "output")
            new_out.args = (type(values)(None if s is not None else v for v, s in zip(new_out.args[0], sym)),)
            views = alias_module(gm, aliases) if aliases else None
            gm = torch.fx.GraphModule(gm, graph)
            stripped, slots = without_none_outputs(gm)
            return stripped, tuple(s if s is not None else slot for slot, s in zip(slots, sym)), views
    return (*without_none_outputs(gm), None)


def _symint(v: Any) -> Any:
    val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
    return val if isinstance(val, torch.SymInt) else None


class Dynamic:
    """AOTAutograd's callable for a graph with symbolic sizes (boxed: one list argument).

    A call at sizes the first variant has run before is one dict lookup keyed by the sizes it
    reads (`_fast`: that variant's `SymbolicExecutor.runs` where its calls return the executor's
    outputs as they are, else a call per size with the sizes bound); anything else (a new size,
    another variant, the per-shape fallback) takes `_call`."""

    _boxed_call = True

    def __init__(
        self,
        compile_variant: Callable[..., Any],
        per_shape: Callable[[], Callable],
        gm: torch.fx.GraphModule,
        first: Any = None,
        meta: Callable[[], None] | None = None,
        stored: Callable[[Any, list], Any] | None = None,
    ) -> None:
        # Also an instance attribute: wrappers (torch._dynamo.disable on a backward) copy `__dict__` only.
        self._boxed_call = True
        self.gm = gm
        self._compile_variant = compile_variant  # (gm, env, kind) -> CompiledGraph
        self._per_shape = per_shape
        self.variants: list[tuple[SymbolicExecutor, Callable[[tuple[int, ...], list], list]]] = []
        self.fallback: Callable | None = None
        self._slots: tuple[Any, ...] | None = None  # size_slots(gm), once the per-shape path needs it
        self._key: Callable[[list], Any] = _no_key  # the first variant's size reader
        self._fast: dict[Any, Callable[[list], list]] = {}
        self._own_fast = False  # `_fast` is ours (filled per size), not the executor's `runs`
        # A CompiledGraph loaded for this graph (entry/warm_program.py): the first variant where
        # it serves the first call's sizes. Until then `gm` may lack node metadata: `meta` sets it.
        self._first = first
        self._meta = meta or _nothing
        # `stored(env, args)`: a later variant an earlier process kept for these sizes, or None
        self._stored = stored or _none

    def __call__(self, args: list) -> Any:
        try:
            run = self._fast.get(self._key(args))
        except Exception:  # arguments the first variant cannot read: `_call` says what is wrong
            run = None
        if run is not None:
            return run(args)
        return self._call(args)

    def _call(self, args: list) -> Any:
        if self.fallback is not None:
            return self._per_shape_call(args)
        for k, (ex, run) in enumerate(self.variants):
            values = ex.values(args)
            if ex.serves(values):
                out = run(values, args)
                if k == 0 and self._own_fast:
                    if len(self._fast) >= MAX_EXECUTORS:
                        self._fast.clear()
                    self._fast[values] = functools.partial(run, values)
                return out
        run_new = self._new_variant(args)
        if run_new is None:
            return self._per_shape_call(args)
        return run_new(args)

    def _per_shape_call(self, args: list) -> Any:
        """The per-shape program's outputs, views of inputs made by torch as in `_runner` (the
        per-shape program's copies would be rebuilt by AOTAutograd from the wrong offsets too)."""
        _, slots, views = size_slots(self.gm) if self._slots is None else self._slots
        self._slots = (None, slots, views)
        made = views(*args) if views is not None else ()
        out = list(self.fallback(*args))  # type: ignore[misc]
        for i, s in enumerate(slots):
            if isinstance(s, AliasOutput):
                out[i] = made[s.index]
        return out

    def _new_variant(self, args: list) -> Callable | None:
        if len(self.variants) >= MAX_VARIANTS:
            self._meta()
            self.fallback = self._per_shape()
            return None
        first, self._first = self._first, None
        if first is None or not _serves(first.executor, args):
            first = None
            self._meta()  # what lowering and size_slots read
        stripped, slots, views = size_slots(self.gm)  # a loaded program's outputs need no metadata
        try:
            env = first.executor.env if first is not None else sym_env(stripped, args)
            if first is None and self.variants:  # the first was looked up when the graph was loaded
                first = self._stored(env, args)
            compiled = first if first is not None else self._compile_variant(stripped, env)
            executor = compiled.executor
            if not isinstance(executor, SymbolicExecutor):
                raise TypeError("not compiled over its symbols")
        except VfuseCodegenError:
            raise  # a vfuse bug the caller asked to see (raise_codegen_errors)
        except Exception as e:
            warnings.warn(
                f"vfuse: a graph with symbolic sizes is compiled per shape: {type(e).__name__}: {e}", stacklevel=3
            )
            self._meta()
            self.fallback = self._per_shape()
            return None
        names = executor.names
        outputs = tuple(SizeOutput(s.node.expr, names) if isinstance(s, torch.SymInt) else s for s in slots)
        run = _runner(compiled, outputs, views)
        self.variants.append((executor, run))
        if len(self.variants) == 1:
            self._key = executor.read
            self._own_fast = run != executor.run
            self._fast = {} if self._own_fast else executor.runs
        values = executor.values(args)
        if not executor.serves(values):
            raise RuntimeError(f"vfuse: a program compiled for sizes {values} rejects them (guards {env.guards})")
        if len(self.variants) == 1 and self._own_fast:
            self._fast[values] = functools.partial(run, values)
        return lambda a: run(executor.values(a), a)  # the first call (then the loop in __call__)


def _no_key(args: list) -> None:
    return None


def _nothing() -> None:
    pass


def _none(env: Any, args: list) -> None:
    return None


def _serves(executor: Any, args: list) -> bool:
    try:
        return bool(executor.serves(executor.values(args)))
    except Exception:  # arguments it cannot read: compiled as usual, which says what is wrong
        return False


def _runner(compiled: Any, slots: tuple[Any, ...], views: Any = None) -> Callable[[tuple[int, ...], list], list]:
    """`run(values, args)`: the call at sizes `values` already read (in the common case the
    executor's own `run`: no frame of ours in between)."""
    if compiled.unchecked_runner is compiled.executor:  # no output can alias: sizes read once
        execute = compiled.executor.run
    else:
        runner = compiled.unchecked_runner
        execute = lambda values, args: runner(args)  # noqa: E731
    if all(s is COMPUTED for s in slots):
        return execute

    def run(values: tuple[int, ...], args: list) -> list:
        made = views(*args) if views is not None else ()  # before the kernels: they may write outputs in place
        it = iter(execute(values, args))
        return [
            next(it)
            if s is COMPUTED
            else s.fn(*values)
            if isinstance(s, SizeOutput)
            else made[s.index]
            if isinstance(s, AliasOutput)
            else s
            for s in slots
        ]

    return run
