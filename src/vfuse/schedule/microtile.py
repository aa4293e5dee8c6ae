"""Register tiles of the contraction kernels, from the target's vector unit.

A GEMM / conv micro-kernel keeps an MR x NR tile of C in vector registers: MR * NR/W
accumulators, NR/W vectors of B and one broadcast of A per k step must fit the register file
(W = fp32 lanes per vector). The flash-attention kernel keeps 4 keys (or 4 rows of the output)
x NR lanes of scores in registers the same way. The renderers draw what is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.ir.sym import hint

Tile = tuple[int, int]  # (mr, nr) in elements


@dataclass(frozen=True, slots=True)
class VectorUnit:
    """fp32 lanes of one vector instruction and architectural vector registers of one core."""

    lanes: int = 16
    registers: int = 32


AVX512 = VectorUnit(16, 32)
WIDTHS = (4, 8, 16)  # fp32 lanes the kernels have vector types for (codegen/cpp/simd.py)


def vector_unit(lanes: int, registers: int) -> VectorUnit:
    """A target's vector unit as the contraction kernels use it: a GPU's 32-lane warps or 255
    registers per thread describe no CPU vector, and plan as AVX-512."""
    if lanes not in WIDTHS or registers > 32:
        return AVX512
    return VectorUnit(lanes, registers)


# Per (lanes, registers), (mr, vectors of nr), fastest in isolation first (most FMAs per load).
# AVX-512: 14x32 (28 accumulators), 8x48 and 6x64 cut padding for some shapes (64 channels: 8x48).
# AVX2 (16 ymm): 6x16 (12 accumulators + 2 B + a broadcast, BLIS's Haswell tile), 4x24 (all 16).
# NEON (32 q registers, 4 lanes): 8x12 (24 accumulators, BLIS's Cortex-A57 tile), 12x8, 6x16.
_TILES: dict[tuple[int, int], tuple[Tile, ...]] = {
    (16, 32): ((14, 2), (8, 3), (6, 4)),
    (8, 16): ((6, 2), (4, 3)),
    (4, 16): ((6, 2), (4, 3)),  # SSE2 (generic x86-64): AVX2's tiles at half the width
    (4, 32): ((8, 3), (12, 2), (6, 4)),
}


# The direct stride-1 conv (codegen/cpp/gemm/conv_direct.py) loads B unaligned from the padded input
# planes and runs OCg % mr rows as a tail block. There AVX2's 4x24 (3 B loads + 4 broadcasts per 12
# FMAs, 6x16 needs 2 + 6) measured 2-4% faster than 6x16 at 64 and 128 channels, a tie at 32/256
# (Zen 4, one thread); GEMMs stay on 6x16 (a tie or better there). Others: the GEMM order.
_DIRECT_CONV_TILES: dict[tuple[int, int], tuple[Tile, ...]] = {(8, 16): ((4, 3), (6, 2))}
# ... on large planes only: on hf_resnet's 16x16 and 8x8 planes (288 and 80 padded columns) 4x24 made
# the whole model 3.9 ms against 3.3 ms with 6x16 (2 threads, VFUSE_ISA=avx2, same process); measured
# faster at 56x56 (3248 columns); the threshold between is not measured.
DIRECT_TILES_MIN_COLUMNS = 1024


# The direct conv's compact columns (codegen/cpp/gemm/conv_direct.py: each vector of a sliver is `lanes`
# outputs of one row, loaded through its own pointer, so no garbage column is computed and each tile
# row is one contiguous run of the output): where OW % lanes == 0 and it computes fewer slivers than
# the padded width. Measured on AVX2 only (Zen 3 and 4, one thread), hence lanes <= 8: 8x8 and 16x16
# planes faster, and since the kernel loads through a pointer per vector (no spilled offsets) also
# 56x56, 1.8 % fewer columns: conv_bn_relu 2.6 % faster than the padded width (docs/perf-log.md).


def compact_conv_columns(oh: int, ow: int, wp: int, nr: int, lanes: int) -> bool:
    """Whether the direct conv computes OH x OW compact columns instead of OH x Wp padded-width ones."""
    if lanes > 8 or ow % lanes or wp <= ow:
        return False
    return _round_up(oh * ow, nr) < _round_up(oh * wp, nr)


def gemm_order_tiles(m: int, n: int, lanes: int) -> list[Tile]:
    """For units of `lanes` lanes whose direct conv has its own order: the tile the GEMM order picks
    for an m x n output (the cost model's conservative figure, schedule/contraction.library_choice)."""
    return [pick_micro_tile(m, n, VectorUnit(w, r)) for w, r in _DIRECT_CONV_TILES if w == lanes]


def _fits(mr: int, nv: int, registers: int) -> bool:
    return mr * nv + nv + 1 <= registers


def micro_tiles(unit: VectorUnit, direct_conv: bool = False) -> tuple[Tile, ...]:
    """The (mr, nr) register tiles for `unit`, the default first (`direct_conv`: for the direct conv
    kernel). Units without a measured table get the widest mr for 2, 3 and 4 vectors of B that fits."""
    key = (unit.lanes, unit.registers)
    shapes = (_DIRECT_CONV_TILES.get(key) if direct_conv else None) or _TILES.get(key)
    if shapes is None:
        shapes = tuple((m, nv) for nv in (2, 3, 4) if (m := (unit.registers - nv - 1) // nv) >= 1)
    return tuple((mr, nv * unit.lanes) for mr, nv in shapes or ((1, 1),))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


# Another tile replaces the default where it pads this much less work, per vector unit: the default
# is the fastest at equal padding, by how much measured. AVX-512's 6x64 ran 8 % slower than 14x32
# with no padding at all (336 x 1024 @ 1024 x 384, 2 threads: 772 vs 716 us), so at 256 rows its 3 %
# less padding lost 12 % (435 vs 387 us; 128 rows: 464 vs 400); 64 output channels (14x32: 9 % waste,
# 8x48: none) still take 8x48. AVX2's 6x16 and 4x24 are within 2-4 % of each other (below).
_PADDING_GAIN: dict[tuple[int, int], float] = {(16, 32): 1.08}
PADDING_GAIN = 1.03


def pick_micro_tile(m: int, n: int, unit: VectorUnit = AVX512, direct_conv: bool = False) -> Tile:
    """The default tile, unless another pads `_PADDING_GAIN` times less work (e.g. 64 output channels:
    AVX-512's 14x32 computes 70 rows (9% waste), 8x48 exactly 64)."""
    m, n = hint(m), hint(n)  # a performance choice: at a symbolic size's hint
    tiles = micro_tiles(unit, direct_conv and n >= DIRECT_TILES_MIN_COLUMNS)

    def padded(tile: Tile) -> float:
        mr, nr = tile
        return (_round_up(m, mr) * _round_up(n, nr)) / (max(m, 1) * max(n, 1))

    best = min(tiles, key=padded)
    gain = _PADDING_GAIN.get((unit.lanes, unit.registers), PADDING_GAIN)
    return best if padded(best) < padded(tiles[0]) / gain else tiles[0]


ATTENTION_ROWS = 4  # keys per score block / output rows per P @ V block
ATTENTION_BLOCK_Q = 64  # query rows per task


def attention_tile(unit: VectorUnit) -> Tile:
    """(4, nr): 4 keys x nr query rows of scores (4 output rows x nr columns of P @ V) in registers;
    nr is the most whole vectors, at most 4 and the 64-row Q block, with 4 * v + v + 1 registers (the
    templates take one narrower tile for the columns left: AVX2's 4 x 3 vectors measured 6-8 % faster
    in the backward than 4 x 2, which divides the block)."""
    per_block = ATTENTION_BLOCK_Q // unit.lanes
    nv = max((v for v in range(1, min(per_block, 4) + 1) if _fits(ATTENTION_ROWS, v, unit.registers)), default=1)
    return ATTENTION_ROWS, nv * unit.lanes


ATTENTION_BLOCK_K = 64  # keys per K/V tile


def attention_blocks(unit: VectorUnit, head_dim: int, value_dim: int, l2_bytes: int) -> tuple[int, int]:
    """(query rows, keys) per tile of the attention kernels. The backward's per-thread tiles (Q and dO
    transposed, scores and their gradients, dQ / dK / dV accumulators) should stay in half of L2:
    large head sizes halve the key tile, down to 16 keys."""
    bq, bk = ATTENTION_BLOCK_Q, ATTENTION_BLOCK_K
    d, dv = (_round_up(hint(x), unit.lanes) for x in (head_dim, value_dim))

    def floats(bk: int) -> int:
        return bq * (2 * d + dv) + bk * (2 * bq + d + dv)

    while bk > 16 and floats(bk) * 4 > l2_bytes // 2:
        bk //= 2
    return bq, bk
