"""How a kernel runs on a GPU target: its walk, launch and contraction tiles, decided in
`schedule/gpu.py` and read by the Triton renderer (`codegen/triton`). Kept apart from
`schedule/kernel.py`, which re-exports them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vfuse.schedule.rowmerge import RowMerge


class GpuWalk(enum.Enum):
    """How GPU programs walk a kernel (`schedule/gpu.py`); the Triton renderer is chosen by it."""

    FLAT = "flat"  # no reductions: each program takes `block` consecutive elements of the flattened nest
    ROWS = "rows"  # `rows` rows per program, each reduced along the row in chunks of `block` elements
    COLUMNS = "columns"  # `rows` adjacent columns (kept elements) per program, reduced in chunks of `block` rows


@dataclass(frozen=True)
class GpuLaunch:
    """A kernel's GPU launch and tiling, decided from the target's preset table (`schedule/gpu.py`)."""

    walk: GpuWalk
    block: int  # FLAT: elements per program; ROWS / COLUMNS: reduced elements per chunk (a power of two)
    rows: int  # ROWS / COLUMNS: rows (columns) per program (a power of two); FLAT: 1
    programs: int  # the grid
    warps: int
    persistent: bool = False  # the row is one chunk: loaded once, every pass reads it from registers
    wide: bool = False  # 64-bit index arithmetic: an index or the grid's span reaches 2^31
    check_block: int = 0  # elements per program of the kernel's gather-index checks (0: none)
    merges: tuple[RowMerge, ...] = ()  # looped rows: pairs of passes read in one walk of the row
    # FLAT: the first `unmasked` programs take full blocks without a mask (the rest, at most one,
    # the masked tail). A mask `i < n` is constant over 2^k lanes only where 2^k divides n, so an
    # odd n keeps masked accesses scalar; mask-free programs load and store 16-byte vectors.
    unmasked: int = 0


class ConvLayout(enum.Enum):
    """How an implicit-GEMM conv template reads its operands (`schedule/gpu.py` `conv_layout`)."""

    NCHW = "nchw"  # the IR's row-major x and OIHW w; K over (cin, kh, kw): gathered, scalar loads
    # x bound channels-last (NHWC memory), w too (OHWI memory: a [Cout, KH*KW*Cin] matrix); K over
    # (kh, kw, cin), so an A tile's rows are runs of contiguous channels (16-byte loads)
    NHWC = "nhwc"


@dataclass(frozen=True)
class GpuTiles:
    """A contraction template's tiling on a GPU target (`schedule/gpu.py`). GEMM and implicit-GEMM
    conv: `block_m` x `block_n` output tiles, `block_k` per step of the reduction, `group_m` rows of
    tiles walked together (grouped order: L2 reuse); attention: `block_m` query rows x `block_n` keys
    per step. `dot` is the dtype tl.dot takes ("fp16", "bf16", "fp32": exact fp32, no TF32; "fp8": the fp8
    operand buffers as they are, `ContractionKernel.fp8`)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    warps: int
    stages: int
    programs: int  # the grid (1-D: batch, group or head, then the tiles)
    dot: str = "fp32"
    wide: bool = False  # 64-bit offsets: a buffer reaches 2^31 elements
    layout: ConvLayout | None = None  # CONV2D: how x and w are read (None: not a conv)
    # NHWC conv: each K step stays within one (kh, kw) tap (`block_k` divides the group's input
    # channels), so a step's A tile is one row offset per pixel plus `block_k` contiguous channels
    # and its mask is per pixel only
    tap_steps: bool = False


__all__ = ["ConvLayout", "GpuLaunch", "GpuTiles", "GpuWalk"]
