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

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from vfuse.entry.outputs import COMPUTED, without_none_outputs
from vfuse.errors import VfuseCodegenError
from vfuse.frontend.symbols import sym_env
from vfuse.ir.sym import python
from vfuse.runtime.symbolic import SymbolicExecutor

MAX_VARIANTS = 8  # programs per graph before it is compiled per shape


class SizeOutput:
    """An output slot holding a size: an expression over the symbols, evaluated per call."""

    def __init__(self, expr: sympy.Basic, names: Sequence[str]) -> None:
        self.expr = expr
        self.fn = eval(f"lambda {', '.join(names) or '_=None'}: {python(expr)}")

    def __repr__(self) -> str:
        return f"SIZE({self.expr})"


def size_slots(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """`gm` without its non-tensor outputs, and the slots (COMPUTED, a constant, or a SymInt's
    value node) to put them back."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0]
    if isinstance(values, list | tuple):
        sym = [_symint(v) for v in values]
        if any(s is not None for s in sym):
            # A SymInt output is no tensor: replace it by None for without_none_outputs to drop.
            import copy

            graph = copy.deepcopy(gm.graph)
            new_out = next(n for n in graph.nodes if n.op == "output")
            new_out.args = (type(values)(None if s is not None else v for v, s in zip(new_out.args[0], sym)),)
            gm = torch.fx.GraphModule(gm, graph)
            stripped, slots = without_none_outputs(gm)
            return stripped, tuple(s if s is not None else slot for slot, s in zip(slots, sym))
    return without_none_outputs(gm)


def _symint(v: Any) -> Any:
    val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
    return val if isinstance(val, torch.SymInt) else None


class Dynamic:
    """AOTAutograd's callable for a graph with symbolic sizes (boxed: one list argument)."""

    _boxed_call = True

    def __init__(
        self, compile_variant: Callable[..., Any], per_shape: Callable[[], Callable], gm: torch.fx.GraphModule
    ) -> None:
        self.gm = gm
        self._compile_variant = compile_variant  # (gm, env, kind) -> CompiledGraph
        self._per_shape = per_shape
        self.variants: list[tuple[SymbolicExecutor, Callable[[list], list]]] = []
        self.fallback: Callable | None = None

    def __call__(self, args: list) -> Any:
        if self.fallback is not None:
            return self.fallback(*args)
        for ex, run in self.variants:
            values = ex.values(args)
            if ex.serves(values):
                return run(args, values)
        run_new = self._new_variant(args)
        if run_new is None:
            return self.fallback(*args)  # type: ignore[misc]
        return run_new(args)

    def _new_variant(self, args: list) -> Callable | None:
        if len(self.variants) >= MAX_VARIANTS:
            self.fallback = self._per_shape()
            return None
        stripped, slots = size_slots(self.gm)
        try:
            env = sym_env(stripped, args)
            compiled = self._compile_variant(stripped, env)
            executor = compiled.executor
            if not isinstance(executor, SymbolicExecutor):
                raise TypeError("not compiled over its symbols")
        except VfuseCodegenError:
            raise  # a vfuse bug the caller asked to see (raise_codegen_errors)
        except Exception as e:
            warnings.warn(
                f"vfuse: a graph with symbolic sizes is compiled per shape: {type(e).__name__}: {e}", stacklevel=3
            )
            self.fallback = self._per_shape()
            return None
        names = executor.names
        outputs = tuple(SizeOutput(s.node.expr, names) if isinstance(s, torch.SymInt) else s for s in slots)
        run = _runner(compiled, outputs)
        self.variants.append((executor, run))
        values = executor.values(args)
        if not executor.serves(values):
            raise RuntimeError(f"vfuse: a program compiled for sizes {values} rejects them (guards {env.guards})")
        return lambda a: run(a, executor.values(a))  # the first call (then the loop in __call__)


def _runner(compiled: Any, slots: tuple[Any, ...]) -> Callable[[list, tuple[int, ...]], list]:
    if compiled.unchecked_runner is compiled.executor:  # no output can alias: sizes read once
        execute = compiled.executor.run
    else:
        runner = compiled.unchecked_runner
        execute = lambda values, args: runner(args)  # noqa: E731
    if all(s is COMPUTED for s in slots):
        return lambda args, values: execute(values, args)

    def run(args: list, values: tuple[int, ...]) -> list:
        it = iter(execute(values, args))
        return [next(it) if s is COMPUTED else s.fn(*values) if isinstance(s, SizeOutput) else s for s in slots]

    return run
