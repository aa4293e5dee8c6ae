"""Choices a kernel makes per call over symbolic sizes, and the prefetch plans (rows, transpose tiles).

Over symbolic sizes whose range holds both sides of a limit, a choice taken at the hint serves
every later size as the first call's did (a 5-row first call left every later call on one
thread; softmax's first call under the streaming limit left it unstreamed, 1.31x slower). Where
the choice is one comparison of sizes the kernel can compute on entry, the schedule records it as
a `SizeGate` instead: the renderer writes the test once per call (codegen/cpp/function.py) and
both paths of the choice in one body. Fixed sizes never get one (their output stays as it was).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torch.utils._sympy.value_ranges import bound_sympy

from vfuse.ir.sym import SymSize, hint, is_sym

if TYPE_CHECKING:
    from vfuse.schedule.kernel import Load, Store

LINE = 64  # bytes: `SizeGate.aligned` offsets are multiples of a cache line


@dataclass(frozen=True)
class SizeGate:
    """On in a call whose sizes give `moved` >= `limit` (bytes, loop points, rows: the caller's
    unit), every gate of `also` holds, and every size of `aligned` (bytes) is a multiple of LINE;
    or else where `otherwise` holds."""

    moved: SymSize | int
    limit: int
    also: tuple[SizeGate, ...] = ()
    aligned: tuple[SymSize | int, ...] = ()
    otherwise: SizeGate | None = None

    def at_hint(self) -> bool:
        """Whether the gate holds at the hints (no guard: for choices that follow it)."""
        lined = all(hint(a) % LINE == 0 for a in self.aligned)
        if hint(self.moved) >= self.limit and lined and all(g.at_hint() for g in self.also):
            return True
        return self.otherwise is not None and self.otherwise.at_hint()

    @property
    def single(self) -> bool:
        """One `moved >= limit` test and nothing else."""
        return not self.also and not self.aligned and self.otherwise is None

    def text(self, test: Callable[[Any, int], str], line: Callable[[Any], str], conj: str, disj: str) -> str:
        """The gate as a condition: each `moved >= limit` as `test(moved, limit)`, each aligned
        size as `line(size)`, joined by `conj` (and) and `disj` (or); `also` and `otherwise`
        parenthesized where they hold more than one test."""

        def part(g: SizeGate) -> str:
            inner = g.text(test, line, conj, disj)
            return inner if g.single else f"({inner})"

        own = [test(self.moved, self.limit), *(part(g) for g in self.also), *(line(a) for a in self.aligned)]
        joined = conj.join(own)
        if self.otherwise is None:
            return joined
        return f"({joined}){disj}{part(self.otherwise)}" if len(own) > 1 else f"{joined}{disj}{part(self.otherwise)}"


def size_choice(moved: SymSize | int, limit: int) -> bool | SizeGate:
    """Whether `moved` >= `limit`: a bool where that holds or fails at every size (plain ints;
    over the symbols' ranges, no guard: `moved`'s bounds, one `bound_sympy` rather than two
    proofs, which took ~40 ms a choice), else the gate that decides per call. Bounds that are
    not tight only leave a test to the call."""
    if not isinstance(moved, SymSize):
        return moved >= limit
    r = bound_sympy(moved.expr, moved.env.ranges)
    if r.lower >= limit or r.upper < limit:
        return bool(r.lower >= limit)
    return SizeGate(moved, limit)


def both(a: bool | SizeGate, b: bool | SizeGate) -> bool | SizeGate:
    """The conjunction of two choices (a gate holds the other's terms in `also`)."""
    if a is False or b is False:
        return False
    if a is True or b is True:
        return b if a is True else a
    assert isinstance(a, SizeGate) and isinstance(b, SizeGate)
    if a.otherwise is not None and b.otherwise is None:
        a, b = b, a
    if a.otherwise is None:
        return replace(a, also=(*a.also, b))
    return SizeGate(0, 0, (a, b))  # two disjunctions: under a test that always holds


def either(a: bool | SizeGate, b: bool | SizeGate) -> bool | SizeGate:
    """The disjunction of two choices (a gate holds the other in `otherwise`)."""
    if a is True or b is True:
        return True
    if a is False or b is False:
        return b if a is False else a
    assert isinstance(a, SizeGate) and isinstance(b, SizeGate)
    return replace(a, otherwise=b if a.otherwise is None else either(a.otherwise, b))


@dataclass(frozen=True)
class PrefetchLoad:
    """One buffer a row kernel prefetches: `load` reads it (contiguous along the row, moving
    with the row); one prefetch per `step` elements (a cache line); before pass i, the
    elements `shares[i]` = [lo, hi) of the row `RowPrefetch.distance` rows ahead, where
    `live[i]` (false: the share is empty at every size, and nothing is rendered for it)."""

    load: Load
    step: int
    shares: tuple[tuple[SymSize | int, SymSize | int], ...]
    live: tuple[bool, ...]


@dataclass(frozen=True)
class RowPrefetch:
    """What a row kernel prefetches (`prefetch.py`): the rows `distance` ahead of the current one
    (the last row for the last few), in shares spread over the passes. Over symbolic sizes the
    distance may be a size expression (computed once per call) and `gate` say in which calls the
    kernel prefetches at all (`prefetch.plan_prefetch`); fixed sizes have neither."""

    distance: SymSize | int  # rows
    loads: tuple[PrefetchLoad, ...]  # one per buffer
    row_bytes: SymSize | int  # of the widest prefetched buffer's row
    locality: int  # temporal locality hint (3: into L1)
    gate: SizeGate | None = None

    @property
    def per_call(self) -> bool:
        return self.gate is not None or is_sym(self.distance)


@dataclass(frozen=True)
class TilePrefetch:
    """One access whose rows of the next tile a tiled transpose prefetches into L2
    (`TransposeTiles.prefetches`, schedule/transpose.py): `run` elements from the start of each
    of its runs (a tile edge, a line more where runs start mid-line); a store of a kernel that
    streams per call, only in the calls that do not stream (`unless_streamed`)."""

    access: Load | Store
    run: int
    unless_streamed: bool = False
