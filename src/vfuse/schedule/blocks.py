"""Cache blocks of the packed GEMM (Goto/BLIS loop order jc -> pc -> ic -> jr -> ir): the schedule's.

Why these sizes: the micro-kernel streams an MR x KC sliver of packed A and a KC x NR sliver of
packed B. The B sliver is reused by every MR-row sliver of the MC block, so it should stay in
L1 (or at worst L2); the MC x KC block of A is reused by every NR-column sliver, so it should
stay in L2; the KC x NC panel of B is shared by all threads and reused by every MC block, so it
should stay in the shared L3. A large KC matters too: C is read and rewritten once per KC step,
so ceil(K / KC) is the number of passes over C.

Over a symbolic M (K and N fixed: a batch or token count) the blocks that suit a first call of 64
rows (M in one block, K in L1-sized blocks) cost a larger call passes over C it need not make
(K in blocks of 352 at 2048 x 1024 x 4096 instead of one). `call_blocks` splits M's range where
`choose_blocking` changes regime; the GEMM driver picks the piece per call, from the size
(codegen/cpp/gemm/driver.py), so every size runs the blocks a static build of it would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils._sympy.value_ranges import bound_sympy

from vfuse.ir.sym import SymSize, hint, is_sym, pretty
from vfuse.schedule.microtile import AVX512, VectorUnit, pick_micro_tile


@dataclass(frozen=True, slots=True)
class Blocking:
    """Tile sizes in elements. mr x nr is the register tile of `lanes`-wide fp32 vectors (nr whole vectors)."""

    mr: int
    nr: int
    mc: int
    kc: int
    nc: int
    lanes: int = 16

    def __post_init__(self) -> None:
        if min(self.mr, self.nr, self.mc, self.kc, self.nc, self.lanes) < 1 or self.nr % self.lanes:
            raise ValueError(f"bad blocking {self}: sizes must be positive and nr a multiple of lanes")

    @property
    def tw(self) -> int:
        """The register block of the packers' transposes (an A sliver, a transposed B's)."""
        return transpose_block(self.lanes)


def transpose_block(lanes: int) -> int:
    """A transpose's register block: 8 x 8 where a vector holds 8 floats or more (AVX2's and AVX-512's
    24-shuffle rounds), else 4 x 4 (SSE, NEON: one zip per pair of rows and round)."""
    return 8 if lanes >= 8 else 4


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _split(k: int, cap: int) -> int:
    """A KC <= cap (roughly) that cuts k into equal blocks, a multiple of 16 unless it is k itself."""
    if k <= cap:
        return k
    blocks = -(-k // cap)
    return min(k, _round_up(-(-k // blocks), 16))


def choose_blocking(
    m: int,
    n: int,
    k: int,
    l1_bytes: int,
    l2_bytes: int,
    l3_bytes: int,
    micro: tuple[int, int] | None = None,
    unit: VectorUnit = AVX512,
) -> Blocking:
    """Tile sizes for an m x k @ k x n fp32 GEMM from per-core L1/L2 and shared L3 sizes.

    Two regimes, because extra K blocks cost a read-modify-write pass over the C panel:
    * one MC block (small m, e.g. a conv's output channels): C panel m x NC is small and stays
      in L1/L2, so extra passes are cheap; KC keeps the B sliver in 3/4 of L1 and NC keeps the
      B panel in half of L2 (it is consumed right after packing). Measured ~15% on conv 3x3.
    * otherwise C passes go to DRAM: KC = K up to 1280 (one pass; the epilogue sees the final
      sum straight from the micro-kernel), else the B sliver in half of L2; MC x KC in half of
      L2; the shared KC x NC panel in half of L3. Measured: KC=1024 beats 256 on 2048x1024x4096.
    """
    mr, nr = micro or pick_micro_tile(m, n, unit)
    kc_l1 = max(16, (3 * l1_bytes // 4) // (4 * nr) // 16 * 16)
    if _round_up(m, mr) * min(k, kc_l1) * 4 <= l2_bytes // 2:
        kc = _split(k, kc_l1)
        mc, shared = _round_up(m, mr), l2_bytes
    else:
        kc = k if k <= 1280 else _split(k, max(16, min(1024, (l2_bytes // 2) // (4 * nr))))
        mc = max(mr, min(_round_up(m, mr), (l2_bytes // 2) // (4 * kc) // mr * mr))
        shared = l2_bytes if m <= mc else l3_bytes
    nc = max(nr, min(_round_up(n, nr), (shared // 2) // (4 * kc) // nr * nr))
    return Blocking(mr, nr, mc, kc, nc, unit.lanes)


@dataclass(frozen=True, slots=True)
class CallBlocks:
    """A GEMM's cache blocks: `blocks[i]` in calls where `m` <= `upto[i]`, the last one above
    them all (one piece: the same blocks at every size). Each piece's MC covers every M it
    serves that `choose_blocking` puts in one row block (the driver then runs one block of
    rows, as with MC = M rounded up), so a piece behaves as `choose_blocking` at each M.
    Over a symbolic K (`within`, then `upto` is empty): `blocks[i]` in the first call whose
    M <= `within[i][0]` and K <= `within[i][1]` (None: no test; the last piece has none)."""

    m: SymSize | int
    blocks: tuple[Blocking, ...]
    upto: tuple[int, ...] = ()
    k: SymSize | int = 0
    within: tuple[tuple[int | None, int | None], ...] = ()
    # Where M fits one MC block, the driver's threads take row blocks of their own before column
    # chunks (`rows_first`), so none packs another's rows of A.
    rows_first: bool = False


def call_blocks(
    m: SymSize | int,
    n: SymSize | int,
    k: SymSize | int,
    caches: tuple[int, int, int],
    micro: tuple[int, int],
    unit: VectorUnit,
) -> CallBlocks:
    """The blocks of an m x k @ k x n fp32 GEMM: at fixed sizes `choose_blocking`'s; over a symbolic
    M alone, one piece per regime M's range reaches (`_pieces`); over a symbolic N or K, pieces
    per K regime and M regime within it (`_nk_pieces`), not the hints' (hinted at 49, a call at
    2048 ran K in 42 blocks of 49)."""
    if is_sym(n) or is_sym(k):
        return _nk_pieces(m, n, k, caches, micro, unit)
    if not is_sym(m):
        return CallBlocks(m, (choose_blocking(hint(m), hint(n), hint(k), *caches, micro=micro, unit=unit),))
    pieces = _in_range(m, _pieces(n, k, caches, micro, unit))
    if len(pieces) == 1:  # one regime over the whole range: as a fixed size would get at the hint
        return CallBlocks(m, (choose_blocking(hint(m), n, k, *caches, micro=micro, unit=unit),))
    return CallBlocks(m, tuple(b for _, b in pieces), tuple(t for t, _ in pieces[:-1]))


def _range(d: SymSize | int) -> tuple[int, int | None]:
    if not is_sym(d):
        return int(d), int(d)
    r = bound_sympy(d.expr, d.env.ranges)
    return _bound(r.lower) or 1, _bound(r.upper)


def _in_range(d: SymSize | int, pieces: list[tuple[int | None, Blocking]]) -> list[tuple[int | None, Blocking]]:
    """The pieces (ascending upper limits, the last None) whose sizes `d`'s range reaches."""
    lo, hi = _range(d)
    pieces = [(t, b) for t, b in pieces if t is None or t >= lo]
    last = next(i for i, (t, _) in enumerate(pieces) if t is None or (hi is not None and t >= hi))
    return pieces[: last + 1]


# Stands for an unbounded N or K: NC and KC are then their caps (N only sets NC, and NC = its cap
# runs every N below it as one panel, as NC = N rounded up would).
_PAST = 1 << 30


def _nk_pieces(
    m: SymSize | int,
    n: SymSize | int,
    k: SymSize | int,
    caches: tuple[int, int, int],
    micro: tuple[int, int],
    unit: VectorUnit,
) -> CallBlocks:
    """Over a symbolic N or K: K's regimes (one block of 64 or less, then up to twice as deep each
    time through the L1 KC up to 1280, blocks of the L2 KC past it), and within each, M's (`_pieces` at that K),
    each piece `choose_blocking` at its largest sizes (N at its range's end); a call takes the
    first piece its M and K fit."""
    n_at = _range(n)[1] or _PAST
    l1, nr = caches[0], micro[1]
    kc_l1 = max(16, (3 * l1 // 4) // (4 * nr) // 16 * 16)
    # KC is K up to 1280 (one block), so MC follows K: limits doubling from 64 (below, A and the B
    # panel are small whatever MC) keep a call's MC within half of `choose_blocking`'s at its K
    limits = sorted(
        {t for t in (*(kc_l1 >> i for i in range(1, 4)), *(kc_l1 << i for i in range(8))) if 64 <= t < 1280}
    )
    regimes: list[tuple[int | None, Any]] = [(t, None) for t in (*limits, 1280)] + [(None, None)]
    classes = [(t, t or _range(k)[1] or _PAST) for t, _ in _in_range(k, regimes)] if is_sym(k) else [(None, hint(k))]
    within: list[tuple[int | None, int | None]] = []
    blocks: list[Blocking] = []
    for tk, k_at in classes:
        if is_sym(m):
            m_pieces = _in_range(m, _pieces(n_at, k_at, caches, micro, unit))
        else:
            m_pieces = [(None, choose_blocking(hint(m), n_at, k_at, *caches, micro=micro, unit=unit))]
        for tm, b in m_pieces:
            within.append((tm, tk))
            blocks.append(b)
    within[-1] = (None, None)  # the last piece takes every call the others do not
    return CallBlocks(m, tuple(blocks), k=k, within=tuple(within))


def _bound(x: object) -> int | None:
    """A range's end as an int, None where unbounded (sympy's oo, torch's int_oo: no int of theirs)."""
    try:
        return int(x)  # type: ignore[call-overload]
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _pieces(
    n: int, k: int, caches: tuple[int, int, int], micro: tuple[int, int], unit: VectorUnit
) -> list[tuple[int | None, Blocking]]:
    """(largest M, blocks) per regime of `choose_blocking` over M, ascending (None: no limit). One
    block of rows while the A block fits half of L2 at the L1 KC (up to `one`); then the L2 KC,
    rows in one block sharing NC with L2 (up to `rows`, MC's cap), then MC-row blocks with the
    L3's NC. Each piece is `choose_blocking` at its largest M (the last: just past the others)."""
    l1, l2, _ = caches
    mr, nr = micro
    kc_l1 = max(16, (3 * l1 // 4) // (4 * nr) // 16 * 16)
    one = (l2 // 2) // (4 * min(k, kc_l1)) // mr * mr
    kc = k if k <= 1280 else _split(k, max(16, min(1024, (l2 // 2) // (4 * nr))))
    rows = max(mr, (l2 // 2) // (4 * kc) // mr * mr)
    limits = [t for t in (one, rows if rows > one else 0) if t >= 1]
    past = max(limits, default=0) + mr
    at = [*limits, past]
    return [(t if t != past else None, choose_blocking(t, n, k, *caches, micro=micro, unit=unit)) for t in at]


def gemm_blocks(
    shapes: tuple[tuple[int, ...], ...],
    out: tuple[int, ...],
    caches: tuple[int, int, int],
    micro: tuple[int, int],
    lanes: int,
) -> CallBlocks:
    """`call_blocks` of a MATMUL ContractionKernel: A read as `shapes[0]` (... x M x K), C as `out`."""
    a = shapes[0]
    return call_blocks(a[-2], out[-1], a[-1], caches, micro, VectorUnit(lanes))


def describe(b: Blocking, m: int, n: int, k: int) -> str:
    """`"M in one block, K in blocks of 352, N in blocks of 1536"`: the regime `b` puts each size in."""
    dims = ((b.mc, m, "M"), (b.kc, k, "K"), (b.nc, n, "N"))
    return ", ".join(f"{d} in one block" if size >= whole else f"{d} in blocks of {size}" for size, whole, d in dims)


def describe_per_call(c: CallBlocks, n: int, k: int) -> str:
    """Each piece of `c` described at its largest M (the last: above the others), with its range."""
    if c.within:
        return "; ".join(_describe_within(c, b, w, n, k) for b, w in zip(c.blocks, c.within, strict=True))
    parts = [f"{describe(b, t, n, k)} up to {pretty(c.m)} = {t}" for t, b in zip(c.upto, c.blocks, strict=False)]
    past = c.upto[-1] + c.blocks[-1].mr
    return "; ".join([*parts, f"{describe(c.blocks[-1], past, n, k)} above"])


def _describe_within(c: CallBlocks, b: Blocking, within: tuple[int | None, int | None], n: int, k: int) -> str:
    """A piece over a symbolic K described at its largest M and K (`b`'s own blocks above them)."""
    (tm, tk), m = within, hint(c.m)
    at = describe(b, tm or max(m, b.mc + 1), n, tk or max(k, b.kc + 1))
    where = [f"{pretty(d)} <= {t}" for d, t in ((c.m, tm), (c.k, tk)) if t is not None]
    return f"{at} where {' and '.join(where)}" if where else f"{at} otherwise"


# A packed once per call (`shared_a`) while the packed copy stays within this many floats
# (512 KiB: about half an L2, where the micro-kernels read it back from).
SHARED_A_FLOATS = 1 << 17


def shared_a(m: SymSize | int, n: SymSize | int, k: SymSize | int, batch: SymSize | int, b: Blocking) -> bool:
    """Whether the GEMM template packs all of A once per call, in parallel, before its driver
    (`ContractionKernel.shared_a`), where the driver would pack it more than once: with one row
    block (M <= MC) every thread packs the whole A block for its own column chunk (twice the A
    packing at two threads: ~1/8 of a 130x256x256 GEMM), and every column panel (N > NC) packs A
    again. One matrix (`batch` 1), fixed sizes: the buffer's size must bound the driver's own
    slot-0 request on every call."""
    if any(is_sym(x) for x in (m, n, k)):
        return False
    mc_max = -(-b.mc // b.mr) * b.mr
    one_block = -(-m // mc_max) == 1
    fits = -(-m // b.mr) * b.mr * k <= SHARED_A_FLOATS
    return batch == 1 and fits and (one_block or n > b.nc)


def rows_first(n: SymSize | int, k: SymSize | int, prepacked_b: bool, l2_bytes: int) -> bool:
    """Whether threads split M before N where M fits one MC block (`CallBlocks.rows_first`): with
    B packed once (a frozen weight) that fits half an L2, each thread reads all of B from its own
    cache and packs only its rows of A; split by columns, each packed every row (2 threads, M 256:
    256x1024 @ 1024x256 459 -> 402 us, 256x256 @ 256x256 120 -> 87 us, eager 393 / 97; docs/perf-log.md).
    A B past the cache, or packed per call, stays split by columns: each thread reads or packs half."""
    if is_sym(n) or is_sym(k):
        return False
    return prepacked_b and int(n) * int(k) * 4 <= l2_bytes // 2


# The folded weight gradient's transpose and scatter passes take threads from this many elements:
# below, a parallel region costs more than it saves.
THREADED_PASS = 1 << 15


@dataclass(frozen=True, slots=True)
class ConvBlocks:
    """A conv template's choices beside its GEMM cache blocks (`ContractionKernel.conv_blocks`).
    Direct path (codegen/cpp/gemm/conv_direct.py): `icb` input channels per K block, `mb` output
    channels per M block. Folded weight gradient (conv_wgrad.py): whether its transpose of X
    (`threaded_transpose`) and its scatter into the NCHW output (`threaded_scatter`) run on
    several threads (when the call has them). `direct`: the direct path rather than the implicit
    GEMM (schedule/conv_columns.py: its geometry, within its buffers' limits). `weight_once`: the
    implicit GEMM packs the weight once per call for all its images (conv.py `_packed_weight`)."""

    icb: int = 1
    mb: int = 1
    threaded_transpose: bool = False
    threaded_scatter: bool = False
    direct: bool = False
    weight_once: bool = False


def folded_passes(x_elems: int, out_elems: int) -> ConvBlocks:
    """The folded weight gradient's threaded passes: X's transpose over `x_elems`, the scatter
    over the GEMM's `out_elems` (THREADED_PASS each)."""
    return ConvBlocks(threaded_transpose=x_elems >= THREADED_PASS, threaded_scatter=out_elems >= THREADED_PASS)


def direct_blocks(cg: int, ocg: int, taps: int, mr: int, caches: tuple[int, int, int]) -> tuple[int, int]:
    """(icb, mb) of the direct conv with `cg` input and `ocg` output channels per group, `taps`
    kernel taps, register tile rows `mr`. K blocks of input channels keep the A sliver in half of
    L1 (B rows stream from L2 fine, the loads are few per FMA; K blocks of 34 channels measured
    1-2 % slower than all 64). M blocks of output channels keep the block's packed weight in half
    of L2, so that the slivers after the first read it from L2: with the whole weight past L2
    (128 -> 128 channels 3x3: 590 KB; Zen 3's L2: 512 KB) every sliver streamed it from the
    shared L3 again; measured 2-4 % faster on 16x16 and 8x8 planes (AVX2, Zen 3, one thread)."""
    icb = max(1, min(cg, (caches[0] // 2) // (4 * mr * taps)))
    mb = min(_round_up(ocg, mr), max(mr, (caches[1] // 2) // (4 * cg * taps) // mr * mr))
    return icb, mb
