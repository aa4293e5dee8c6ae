"""Software prefetch of the rows a row kernel will read next.

A row kernel (LayerNorm, RMSNorm, softmax over 1024-wide rows) reads its row from memory in
the first pass, then spends most of its time computing on the L1-resident row in the last
pass (GELU, SiLU, the normalization). The hardware prefetcher follows demand misses, and a
4 KiB row is one page, whose stream it has to pick up anew, so the next row's first pass
waited on memory instead of overlapping the current row's arithmetic. Issuing one prefetch
per cache line of the row DISTANCE_BYTES ahead, spread over the passes (a share before
each), hands those misses to the memory system while the passes compute. It is also what
lets a first pass run several accumulator chains (`strips.py`). Measurements: docs/perf-log.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfuse.schedule import expr
from vfuse.schedule.kernel import Kernel, Load

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

LINE = 64  # bytes per cache line: one prefetch each
DISTANCE_BYTES = 12 * 1024  # how far ahead: 2-3 rows of 4 KiB measured best
MAX_DISTANCE = 8  # rows
LOCALITY = 3  # __builtin_prefetch's hint: into L1 (prefetcht0)
MIN_ROW_BYTES = 2048  # shorter rows go through row groups (rowgroups.py), whose prefetch lost


@dataclass(frozen=True)
class RowPrefetch:
    distance: int  # rows ahead
    loads: tuple[Load, ...]  # one per buffer: row-dependent, contiguous along the row
    row_bytes: int  # of the widest prefetched buffer's row


def plan_prefetch(k: Kernel) -> RowPrefetch | None:
    """What `k` prefetches, or None: a row kernel of several passes (a single streaming pass
    keeps the hardware prefetcher busy on its own) with one row loop over one contiguous
    inner loop, loads whose offset is plain loop variables (no div/mod/clamp/gather), stride
    1 along the row and moving with the row; rows of at least MIN_ROW_BYTES."""
    if len(k.passes) < 2 or len(k.outer) != 1 or len(k.inner) != 1 or k.tile or k.outer[0].size < 2:
        return None
    row, vec = expr.Var(k.outer[0].var), expr.Var(k.inner[0].var)
    loads: dict[str, Load] = {}
    for p in k.passes:
        for s in p.body:
            if isinstance(s, Load) and s.buf not in loads and _streams_rows(s.index, row, vec):
                loads[s.buf] = s
    if not loads:
        return None
    row_bytes = max(k.inner[0].size * _itemsize(s) for s in loads.values())
    if row_bytes < MIN_ROW_BYTES:
        return None
    distance = max(1, min(MAX_DISTANCE, math.ceil(DISTANCE_BYTES / row_bytes)))
    return RowPrefetch(distance, tuple(loads.values()), row_bytes)


def _streams_rows(index: expr.Lin, row: expr.Var, vec: expr.Var) -> bool:
    if not all(isinstance(a, expr.Var) for a, _ in index.terms):
        return False
    return index.coef(vec) == 1 and index.coef(row) != 0


def _itemsize(s: Load) -> int:
    return s.dtype.itemsize


def render_prefetch(w: KernelWriter, pf: RowPrefetch, part: int, parts: int) -> None:
    """Prefetch part `part` of `parts` of row `i + distance` (the last row for the last few)
    of every planned buffer: one part before each pass, so a few dozen prefetches at a time
    rather than a whole row's (which stalled the pass behind them on the core's miss buffers)."""
    (lp,) = w.k.outer
    (vec,) = w.k.inner
    row = w.names[lp.var]
    if part == 0:
        w.w(f"const int64_t {row}_pf = {row} + {pf.distance} < {lp.size} ? {row} + {pf.distance} : {lp.size - 1};")
    names = {**w.names, lp.var: f"{row}_pf", vec.var: "c"}
    for s in pf.loads:
        step = LINE // _itemsize(s)
        lines = -(-vec.size // step)
        lo, hi = lines * part // parts * step, min(vec.size, lines * (part + 1) // parts * step)
        if lo < hi:
            addr = f"{_pointer(s.buf)} + {expr.render(s.index, names)}"
            w.w(f"for (int64_t c = {lo}; c < {hi}; c += {step}) __builtin_prefetch({addr}, 0, {LOCALITY});")


def _pointer(buf: str) -> str:
    from vfuse.codegen.cpp.render import pointer  # render imports this module

    return pointer(buf)
