"""Tiled transposes: pointwise kernels whose operands disagree on the contiguous axis.

`relu(x.t() + y)`: the SIMD loop `v` walks y and the output contiguously, but x with a stride of
a whole row, so every element of x costs a cache line and the line is evicted before its
neighbours along the other loop are used (10 % of copy bandwidth). Walking the nest in 2-D
tiles of loops (u, v), where x is contiguous along `u`, reads every operand in runs of whole
lines; the tile of x is transposed through an L1 buffer so the SIMD loop still reads it
contiguously. Stores need none of this: the schedule stores every output of a pointwise
kernel in the nest's own order (`z.t().contiguous()` is computed from transposed loads).

Each tile's accesses are runs of a few lines in many rows (64 rows of 256 bytes), which the
hardware prefetchers do not follow: the next tile's rows of every load (and plain store) are
prefetched into L2, so the misses overlap its arithmetic (one thread, 2048 x 4096 fp32: 12.8 ->
7.8 ms on Zen 4 with this tile's rows prefetched at its start; L1 instead of L2: slower). On cores
with a small L2 (`prefetch.SMALL_L2`: Zen 3) a share of the next tile before each of this tile's
rows (`TransposeTiles.spread`: 12.2 -> 8.2 ms there, 52 -> 78 % of copy); elsewhere the next tile
at this tile's start (Zen 4, transpose_add's kernel one thread, spread / at the start: AVX2 tier
1.24-1.41x, AVX-512 ~1.0; docs/perf-log.md, session 20 H4).

A kernel moving at least STREAM_MIN_LLCS last-level caches writes its tiles' rows around the
caches (`stream_tiles`: `Kernel.stream`): its output is evicted before any reader gets to it, so
the read-for-ownership of every output line (a quarter of `relu(x.t() + y) * sigmoid(y)`'s
traffic) buys nothing; the tile rows are whole lines. 2048 x 4096 fp32, CPU time per thread
(Zen 4, two threads): AVX-512 6.0 -> 4.9 ms, AVX2 6.7 -> 6.3 (p10 equal).

`plan_transpose(k, vector, l1)` returns the tiles for `k`, or None where the walk does not apply;
`with_tile_prefetches(k, l2)`, once the stores' stream choice is made, what the tiles prefetch and when.
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.ir.sym import SymSize, hint, is_sym, known_multiple
from vfuse.schedule.blocks import transpose_block
from vfuse.schedule.expr import Clamp, Div, Dyn, Lin, Mod, Var, walk
from vfuse.schedule.gates import SizeGate, TilePrefetch, size_choice
from vfuse.schedule.kernel import Kernel, Load, Store, TransposeTiles
from vfuse.schedule.prefetch import SMALL_L2

MIN_ELEMENTS = 4096  # below this the whole kernel is in L1 anyway
EDGES = (64, 32, 16)  # tile edges tried, largest first (`_edge`)
STREAM_MIN_LLCS = 2  # bytes moved (whole-tensor loads and stores) for streamed stores
LINE = 64
LONG_RUN = 512  # bytes: runs this long, or rows one after another, are streams the hardware follows


def plan_transpose(k: Kernel, vector: int, l1: int) -> TransposeTiles | None:
    """The tiles for pointwise kernel `k` (vectors of `vector` fp32 lanes, `l1` bytes of L1 data
    cache per core), when a load or store is contiguous along another loop than the SIMD loop."""
    if k.outer or len(k.inner) < 2 or len(k.passes) != 1 or k.after or k.table or k.tile:
        return None
    (p,) = k.passes
    # Sizes are a performance matter here (the renderer clamps every tile at run time): symbolic
    # ones are taken at their hints (ir/sym.py).
    if p.reduces or p.buffered or p.reloaded or hint(math.prod(lp.size for lp in k.inner)) < MIN_ELEMENTS:
        return None
    v = k.inner[-1].var
    access = [s for s in p.body if isinstance(s, Load | Store)]
    if any(isinstance(s, Store) and s.index.coef(Var(v)) != 1 for s in access):
        return None  # not built by the schedule today; the plain walk stores anything
    loads = [s for s in access if isinstance(s, Load)]
    along = {s.var: u for s in loads if (u := _transposed_along(s, k, v)) is not None}
    if not along:
        return None
    # The loop most transposed loads are contiguous along; others keep their strided reads.
    ups = list(along.values())
    u = max(set(ups), key=lambda x: (ups.count(x), -x))
    staged = tuple(var for var, w in along.items() if w == u)
    block = transpose_block(vector)
    edge = _edge([s for s in loads if s.var in staged], l1)
    # A short v (NCHW -> NHWC with 3 channels) keeps the tile's area with more rows.
    cols = min(edge, hint(k.inner[-1].size))
    rows = min(-(-edge * edge // cols // block) * block, hint(_size(k, u)))
    return TransposeTiles(u=u, rows=rows, cols=cols, block=block, staged=staged, prefetch=True)


def _size(k: Kernel, var: int) -> int:
    return next(lp.size for lp in k.inner if lp.var == var)


def _transposed_along(s: Load, k: Kernel, v: int) -> int | None:
    """The loop `s` is contiguous along when it strides along `v`, and both loops appear in its
    index only as plain terms (no div/mod/clamp, no loaded index). Short strides count too: a
    line read for a few elements along v is read again for each value of u (NHWC -> NCHW with 7
    channels: 7 sweeps over the input), from memory once the tensor outgrows the caches."""
    e = s.index
    if e.coef(Var(v)) < 2 or _nonlinear(e):
        return None
    for lp in k.inner[:-1]:
        if e.coef(Var(lp.var)) == 1 and lp.size >= 2:
            return lp.var
    return None


def _nonlinear(e: Lin) -> bool:
    """Whether any atom of `e` is not a plain loop variable: the tile copy offsets a staged access
    by its loop coefficients, which needs an index linear in the loops (Dyn: loaded at run time)."""
    return any(isinstance(a, Div | Mod | Clamp | Dyn) for lin in walk(e) for a, _ in lin.terms)


def _edge(staged: list[Load], l1: int) -> int:
    """The largest edge whose staging buffers fill at most half of L1: they are written by the
    transpose and read back by the body, while every other access streams through once (at
    2048x4096 fp32, one staged load: 64 beat 32 by 1.3-1.9x under load, 128 no better than 64)."""
    row = sum(s.dtype.itemsize for s in staged)
    for edge in EDGES:
        if edge * edge * row <= l1 // 2:
            return edge
    return EDGES[-1]


def stream_tiles(k: Kernel, t: TransposeTiles, llc: int) -> bool | SizeGate:
    """Whether the tiles of `k` store around the caches: the kernel's loads and stores that walk
    both tile loops move at least STREAM_MIN_LLCS times `llc` bytes, and a tile row of every store
    is whole cache lines, starting on a line (`llc` 0: never). A row that starts mid-line is
    streamed as a partial line stored plainly, whole lines around the caches and a partial line:
    each line a neighbouring tile shares is then written both ways (1999 x 3001 fp32 on Zen 3,
    one thread: 10.5 ms streamed, 7.0 ms stored plainly). Over symbolic sizes, where the bytes or
    a row's start in bytes may fall either way, a gate the kernel tests per call."""
    (p,) = k.passes
    stores = [s for s in p.body if isinstance(s, Store)]
    if not llc or not stores or any(t.cols * s.dtype.itemsize % LINE for s in stores):
        return False
    u, v = Var(t.u), Var(k.inner[-1].var)
    whole = [s for s in p.body if isinstance(s, Load | Store) and s.index.coef(u) != 0 and s.index.coef(v) != 0]
    moved = math.prod(lp.size for lp in k.inner) * sum(s.dtype.itemsize for s in whole)
    choice = size_choice(moved, STREAM_MIN_LLCS * llc)
    starts = [b for s in stores for b in _row_starts(s, k)]
    if choice is False or any(not is_sym(b) and b % LINE for b in starts):
        return False
    aligned = tuple(b for b in starts if is_sym(b) and not known_multiple(b, LINE))
    if not aligned:
        return choice
    return SizeGate(moved, STREAM_MIN_LLCS * llc, aligned=aligned)


def _row_starts(s: Store, k: Kernel) -> list[SymSize | int]:
    """The bytes that place each row of `s` along the SIMD loop: its offset and the other loops'
    strides (every row starts on a cache line where each is a multiple of one: buffers are
    line-aligned)."""
    v = Var(k.inner[-1].var)
    return [c * s.dtype.itemsize for c in (s.index.const, *(c for a, c in s.index.terms if a != v))]


def with_tile_prefetches(k: Kernel, l2: int = 0) -> Kernel:
    """`k` with what its tiles prefetch (`TransposeTiles.prefetches`), in the order rendered, and
    when (`spread` over the tile's rows on cores with `l2` bytes of L2 up to SMALL_L2 or unknown,
    else at the tile's start): the
    next tile's row of each load and plain store contiguous along v (rows along u), then each
    staged load's runs along u. Runs the hardware prefetchers follow are left to them (`_streams`).
    A prefetch for writing reads the line, what streaming stores save: a streamed kernel's stores
    are not prefetched, a kernel that streams per call prefetches them in the calls that do not.
    Sizes are taken at their hints (the strides here are rows of the tensors)."""
    t = k.transpose
    if t is None or not t.prefetch:
        return k
    (p,) = k.passes
    u, v = Var(t.u), Var(k.inner[-1].var)
    out = []
    for s in p.body:
        if not isinstance(s, Load | Store) or (isinstance(s, Load) and s.var in t.staged):
            continue
        store = isinstance(s, Store)
        row = s.index.coef(u)
        if (store and k.stream and k.stream_gate is None) or s.index.coef(v) != 1 or not row:
            continue
        if not _streams(t.cols, row, s):
            out.append(TilePrefetch(s, _run(t.cols, row, s), store and k.stream))
    for s in p.body:
        if isinstance(s, Load) and s.var in t.staged and not _streams(t.rows, s.index.coef(v), s):
            out.append(TilePrefetch(s, _run(t.rows, s.index.coef(v), s)))
    spread = l2 <= SMALL_L2  # 0: unknown
    return dataclasses.replace(k, transpose=dataclasses.replace(t, prefetches=tuple(out), spread=spread))


def _streams(edge: int, row: SymSize | int, s: Load | Store) -> bool:
    """Whether runs of `edge` elements `row` apart are a stream the hardware prefetchers follow:
    long runs, or runs one after another (NCHW -> NHWC with 3 channels: 3 planes read in runs of
    1368, the 12-byte rows of the output back to back; prefetching them: 1.4x slower)."""
    return edge * s.dtype.itemsize >= LONG_RUN or abs(hint(row)) == edge


def _run(edge: int, row: SymSize | int, s: Load | Store) -> int:
    """Elements prefetched from the start of a run of `edge` elements: one line more where rows
    (`row` elements apart) start mid-line, as the run then touches one line more (1999 x 3001 fp32
    on Zen 3, one thread: 7.0 -> 6.3 ms)."""
    line = LINE // s.dtype.itemsize
    return edge if hint(row) % line == 0 else edge + line
