"""Evaluates the schedule's per-call gates (`schedule.gates.SizeGate`) at a call's sizes, as the
generated test does: tests use it to check that their calls ran both paths of a choice."""

from __future__ import annotations

from typing import Any

from vfuse.ir.sym import SymSize, is_sym
from vfuse.schedule.gates import LINE, SizeGate
from vfuse.schedule.kernel import BufKind, Program


def value(x: Any, sizes: dict[str, int]) -> int:
    """`x` (an int or a symbolic size) at the symbols' values, by name."""
    if not isinstance(x, SymSize):
        return int(x)
    env = x.env
    return env.evaluator(x.expr)(*(sizes[s.name] for s in env.symbols))


def holds(gate: SizeGate, sizes: dict[str, int]) -> bool:
    """Whether `gate` lets a call of these sizes take its choice."""
    own = value(gate.moved, sizes) >= gate.limit and all(value(a, sizes) % LINE == 0 for a in gate.aligned)
    if own and all(holds(g, sizes) for g in gate.also):
        return True
    return gate.otherwise is not None and holds(gate.otherwise, sizes)


def sizes_of(program: Program, *shapes: tuple[int, ...]) -> dict[str, int]:
    """The symbols' values in a call whose graph inputs (in slot order, those with a symbolic
    size) have these shapes: each symbol that is a whole dim takes that dim's size."""
    inputs = [b for b in program.buffers.values() if b.kind is BufKind.INPUT]
    inputs = [b for b in sorted(inputs, key=lambda b: b.slot) if any(is_sym(d) for d in b.type.shape)]
    out: dict[str, int] = {}
    for buf, shape in zip(inputs, shapes, strict=False):
        for d, n in zip(buf.type.shape, shape, strict=True):
            if isinstance(d, SymSize) and d.expr.is_Symbol:
                out[d.expr.name] = n
    return out
