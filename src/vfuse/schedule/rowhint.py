"""Short rows of a symbolic length: a copy of the kernel scheduled at the length's hint.

The walks that make short rows fast need the row length when compiling: lanes unrolled for one
length, strips of a constant trip count, row groups (`strategy.use_lanes`, `strip_chains`,
`use_row_groups`). Over a symbolic length the kernel takes the plain SIMD accumulation, which
serves every length; the last ~1 us of tiny_graph's dynamic call over its static one (11 passes
over 64-element rows) was that. So a row kernel whose length's hint is short, and whose copy at
the hint walks or accumulates otherwise, carries that copy (`Kernel.at_hint`): the renderer
writes both and each call takes the one its sizes select (`codegen/cpp/render.at_hint`). No
guard: both are exact at every size. The report lists it with the per-call choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import sympy

from vfuse.ir.sym import SymSize, free_symbols, hint
from vfuse.schedule.kernel import Accumulate, HintCopy, Kernel, Walk

# Rows up to one reduction block (strategy.BLOCK): longer rows are bound by memory, not by the
# accumulation's chains, and their walk does not change with a constant length.
SHORT_ROW = 1024
_ROW_WALKS = (Walk.SINGLE_ROW, Walk.ROWS, Walk.ROW_GROUPS)


def with_hint_copy(raw: Kernel, schedule: Callable[[Kernel], Kernel]) -> Kernel:
    """`schedule(raw)`, with the copy at its row length's hint where that copy is scheduled
    differently (another walk, or reductions with lanes or strips)."""
    k = schedule(raw)
    sizes = _row_symbols(k)
    if not sizes:
        return k
    env = next(lp.size.env for lp in k.inner if isinstance(lp.size, SymSize))
    seen = (len(env.guards), set(env._seen))
    copy = schedule(at_sizes(raw, {s: sympy.Integer(h) for s, h in sizes}))
    if len(env.guards) != seen[0]:  # the copy decided on a size the kernel did not: none then
        del env.guards[seen[0] :]
        env._seen = seen[1]
        return k
    if not _walks_otherwise(copy, k):
        return k
    return dataclasses.replace(k, at_hint=HintCopy(tuple((s.name, h) for s, h in sizes), copy))


def _row_symbols(k: Kernel) -> list[tuple[sympy.Symbol, int]]:
    """The symbols of a short row walk's row length and their hints; none for a fixed length."""
    if k.walk not in _ROW_WALKS or not k.inner or not any(p.reduces for p in k.passes):
        return []
    length = 1
    for lp in k.inner:
        length *= lp.size
    if not isinstance(length, SymSize) or hint(length) > SHORT_ROW:
        return []
    return sorted(((s, length.env.hints[s]) for s in free_symbols([length])), key=lambda p: p[0].name)


def _walks_otherwise(copy: Kernel, k: Kernel) -> bool:
    """Another walk, or a pass accumulating in lanes or strips over the constant length where the
    generic kernel's accumulates otherwise (its run-time lanes: `strategy.run_time_chains`)."""
    unrolled = (Accumulate.LANES, Accumulate.STRIPS)
    pairs = zip(copy.passes, k.passes, strict=True)
    faster = any(c.reduction.kind in unrolled and c.reduction != g.reduction for c, g in pairs)
    return copy.walk is not k.walk or faster


def at_sizes(x: Any, subs: dict[sympy.Symbol, sympy.Integer]) -> Any:
    """`x` (a kernel, statement, loop, index, ...) with the symbols in `subs` replaced by their
    values: sizes of those symbols alone become ints."""
    if isinstance(x, SymSize):
        return x.env.size(x.expr.xreplace(subs))
    if isinstance(x, tuple):
        return tuple(at_sizes(v, subs) for v in x)
    if isinstance(x, list):
        return [at_sizes(v, subs) for v in x]
    if isinstance(x, dict):
        return {k: at_sizes(v, subs) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = [f.name for f in dataclasses.fields(x) if f.init]
        return dataclasses.replace(x, **{f: at_sizes(getattr(x, f), subs) for f in fields})
    return x
