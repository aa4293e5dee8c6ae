"""Software prefetch of the rows a row kernel will read next (`Kernel.prefetch`).

A row kernel (LayerNorm, RMSNorm, softmax over 1024-wide rows) reads its row from memory in
the first pass, then spends most of its time computing on the cache-resident row in the last
pass. The hardware prefetcher follows demand misses, and a 4 KiB row is one page, whose stream
it has to pick up anew, so the next row's first pass waited on memory instead of overlapping
the current row's arithmetic. One prefetch per cache line of the row DISTANCE_BYTES ahead,
spread over the passes (a share before each: a whole row's at once stalled the pass behind
them on the core's miss buffers), hands those misses to the memory system while the passes
compute. It is also what lets a first pass run several accumulator chains (`strategy.py`).
The prefetched rows land in L1 (AMD fetches into L1 whatever the locality hint), so they must
fit there beside the rows the passes are using: more evicts lines before their use and costs
more than it hides (Zen 4, 32 KiB L1d: ln_gelu, rms_silu and softmax 1.3-1.45x slower with the
prefetch than without). Measurements: docs/perf-log.md.
"""

from __future__ import annotations

import math

import sympy
from torch.utils._sympy.functions import FloorDiv

from vfuse.ir.sym import SymSize, env_of, hint, is_sym, proved
from vfuse.schedule import expr
from vfuse.schedule.gates import PrefetchLoad, RowPrefetch, SizeGate, both, size_choice
from vfuse.schedule.kernel import Kernel, Load, Store

LINE = 64  # bytes per cache line: one prefetch each
DISTANCE_BYTES = 12 * 1024  # how far ahead: 2-3 rows of 4 KiB measured best
MAX_DISTANCE = 8  # rows
LOCALITY = 3  # into L1 (prefetcht0)
MIN_ROW_BYTES = 2048  # shorter rows go through row groups (`plan_group_prefetch`)
L1_SHARE = 2  # the rows in flight (used + prefetched) may fill 1/L1_SHARE of L1
MIN_DISTANCE = 2  # one row ahead lost to none on Zen 4 (softmax 1.2x slower): too little lead
# Cores with an L2 of at most 512 KiB (Zen 1-3; Intel client cores have 256 KiB) gain from rows
# ahead where those with 1 MiB lose (Zen 4): on Zen 3 (32 KiB L1d) softmax, RMSNorm+SiLU and
# LayerNorm+GELU over 1024-wide rows ran 1.15-1.26x faster (one thread, CPU time) with 2 rows
# ahead filling 62-75 % of L1, which the half-of-L1 rule refused (docs/perf-log.md, 2026-12-01).
# The L2's size separates the machines measured; it stands for their prefetchers, not a cause.
SMALL_L2 = 512 << 10
SMALL_L2_L1_FILL = 0.75  # of L1 for the rows in flight (used + prefetched) on such cores
# Row groups (rows <= 256 elements): LayerNorm 8192x256 on Zen 4, both tiers, two threads: 6 or 8
# rows (6-8 KiB) ahead 1.4-1.6x faster than none, 12 rows 1.3-1.45x (docs/perf-log.md).
GROUP_DISTANCE_BYTES = 8 * 1024
# ... which with a group of 4 rows in use (10 KiB: x and output, weight and bias once) fills 18 of
# 32 KiB: more than L1_SHARE allows, measured better than 6 rows (16 KiB); 12 rows (22 KiB) worse.
GROUP_L1_FILL = 0.6
# Smaller inputs stay in L2 between calls (Zen 4: 1 MiB), where the hardware fetches short rows
# soon enough (not measured: kept as before).
GROUP_MIN_BYTES = 1 << 20
# Rows of 512 bytes (LayerNorm 16384x128) already ran at copy speed without; 16 rows ahead were
# 5-10 % slower (Zen 4, both tiers).
GROUP_MIN_ROW_BYTES = 1024


def plan_prefetch(k: Kernel, l1: int = 48 << 10, l2: int = 0) -> RowPrefetch | None:
    """What `k` prefetches, or None: a row kernel of several passes (a single streaming pass
    keeps the hardware prefetcher busy on its own) with one row loop over one contiguous
    inner loop, loads whose offset is plain loop variables (no div/mod/clamp/gather), stride
    1 along the row and moving with the row; rows of at least MIN_ROW_BYTES; at least
    MIN_DISTANCE rows ahead fitting beside the rows in use in the share of `l1` bytes of L1
    the core's `l2`-byte L2 (0: unknown) allows (`_l1_room`). Over a symbolic row width, the
    distance is computed per call and the conditions are the plan's gate (`_per_call`)."""
    loads = _row_loads(k)
    if not loads:
        return None
    size = k.inner[0].size
    row_bytes = size * max(s.dtype.itemsize for s in loads.values())
    ahead = size * sum(s.dtype.itemsize for s in loads.values())
    spare = _l1_room(l1, l2) - _resident_bytes(k)  # bytes of L1 for the rows ahead
    # min(MAX_DISTANCE, ceil(DISTANCE_BYTES / row_bytes), spare // ahead) >= MIN_DISTANCE, as
    # tests without division (cheap to prove over the ranges; MAX_DISTANCE >= MIN_DISTANCE).
    on = both(size_choice(row_bytes, MIN_ROW_BYTES), size_choice(spare - MIN_DISTANCE * ahead, 0))
    on = both(on, size_choice(DISTANCE_BYTES - (MIN_DISTANCE - 1) * row_bytes, 1))
    if on is False:
        return None
    distance = _distance(row_bytes, spare, ahead)
    planned = tuple(_shares(s, size, len(k.passes)) for s in loads.values())
    return RowPrefetch(distance, planned, hint(row_bytes), LOCALITY, on if isinstance(on, SizeGate) else None)


def _distance(row_bytes: SymSize | int, spare: SymSize | int, ahead: SymSize | int) -> SymSize | int:
    """min(MAX_DISTANCE, ceil(DISTANCE_BYTES / row_bytes), spare // ahead) rows: over symbolic
    sizes an expression the kernel computes once per call (built unevaluated: sympy's
    simplification of these quotients took seconds per kernel)."""
    if not any(is_sym(x) for x in (row_bytes, spare, ahead)):
        return min(MAX_DISTANCE, math.ceil(DISTANCE_BYTES / row_bytes), spare // ahead)
    env = env_of((row_bytes, spare, ahead))
    assert env is not None
    rb, sp, ah = (sympy.sympify(x.expr if isinstance(x, SymSize) else x) for x in (row_bytes, spare, ahead))
    ceil = FloorDiv(rb + DISTANCE_BYTES - 1, rb, evaluate=False)
    return env.size(sympy.Min(MAX_DISTANCE, ceil, FloorDiv(sp, ah, evaluate=False), evaluate=False))


def plan_group_prefetch(k: Kernel, group: int, l1: int = 48 << 10) -> RowPrefetch | None:
    """The same for short rows walked `group` at a time (`Walk.ROW_GROUPS`): each pass's row loop
    prefetches its share of the row `distance` ahead, GROUP_DISTANCE_BYTES of rows ahead where
    GROUP_L1_FILL of L1 holds them beside the group's rows in use, and at least a group ahead (nearer rows are the
    group's own, which its first pass reads anyway). Row groups have a fixed width; over a
    symbolic row count, whether the rows fill GROUP_MIN_BYTES is the plan's gate."""
    loads = _row_loads(k)
    if not loads:
        return None
    row_bytes = max(k.inner[0].size * s.dtype.itemsize for s in loads.values())
    ahead = sum(k.inner[0].size * s.dtype.itemsize for s in loads.values())
    if row_bytes < GROUP_MIN_ROW_BYTES:
        return None
    room = (int(l1 * GROUP_L1_FILL) - _resident_bytes(k, group)) // ahead
    distance = min(math.ceil(GROUP_DISTANCE_BYTES / row_bytes), room)
    on = both(size_choice(k.outer[0].size * ahead, GROUP_MIN_BYTES), distance >= group)
    if on is False:
        return None
    planned = tuple(_shares(s, k.inner[0].size, len(k.passes)) for s in loads.values())
    return RowPrefetch(distance, planned, row_bytes, LOCALITY, on if isinstance(on, SizeGate) else None)


def _l1_room(l1: int, l2: int) -> int:
    """Bytes of L1 the rows in flight of a row walk may fill: half, SMALL_L2_L1_FILL on cores
    with a small L2."""
    return int(l1 * SMALL_L2_L1_FILL) if 0 < l2 <= SMALL_L2 else l1 // L1_SHARE


def _row_loads(k: Kernel) -> dict[str, Load]:
    """The loads `plan_prefetch` may prefetch (none where `k` is not such a row kernel), by buffer."""
    if len(k.passes) < 2 or len(k.outer) != 1 or len(k.inner) != 1 or k.tile or k.outer[0].size < 2:
        return {}
    row, vec = expr.Var(k.outer[0].var), expr.Var(k.inner[0].var)
    loads: dict[str, Load] = {}
    for p in k.passes:
        for s in p.body:
            if isinstance(s, Load) and s.buf not in loads and _streams_rows(s.index, row, vec):
                loads[s.buf] = s
    return loads


def _resident_bytes(k: Kernel, rows: int = 1) -> int:
    """Bytes of L1 the passes over `rows` rows keep in use: those rows of every buffer loaded or
    stored along the row (a buffer that does not move with the row, like LayerNorm's weight,
    once) and of every row buffer."""
    row, vec = expr.Var(k.outer[0].var), expr.Var(k.inner[0].var)
    size = k.inner[0].size
    bufs: dict[str, int] = {}
    for p in k.passes:
        for s in p.body:
            if isinstance(s, (Load, Store)) and s.index.coef(vec) != 0:
                share = s.dtype.itemsize * (rows if s.index.coef(row) != 0 else 1)
                bufs[s.buf] = max(bufs.get(s.buf, 0), share)
    computed = {
        s.var: s.dtype for p in k.passes for s in (*p.before, *p.body) if hasattr(s, "var") and hasattr(s, "dtype")
    }
    buffered = {v for p in k.passes for v in p.buffered}
    row_buffers = sum(max(4, computed[v].itemsize) if v in computed else 4 for v in buffered)
    return size * (sum(bufs.values()) + rows * row_buffers)


def _shares(s: Load, size: SymSize | int, parts: int) -> PrefetchLoad:
    """The row's cache lines of `s` in `parts` shares of about equal size, in order. Only the last
    share reaches the row's end (the others end at least a line before it): no min() of sizes,
    which would guard on a symbolic width. A share empty at every size is not live (a symbolic
    share may be empty at some: it stays, its loop then runs no iteration)."""
    step = LINE // s.dtype.itemsize
    lines = -(-size // step)
    ends = [lines * (part + 1) // parts * step for part in range(parts - 1)] + [size]
    shares = tuple((lines * part // parts * step, end) for part, end in enumerate(ends))
    return PrefetchLoad(s, step, shares, tuple(not proved(hi, "<=", lo) for lo, hi in shares))


def _streams_rows(index: expr.Lin, row: expr.Var, vec: expr.Var) -> bool:
    if not all(isinstance(a, expr.Var) for a, _ in index.terms):
        return False
    return index.coef(vec) == 1 and index.coef(row) != 0
