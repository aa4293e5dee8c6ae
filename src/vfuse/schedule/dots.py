"""The schedule's descriptions of a GEMM's special dot products (fp8 and exact int8), read by the
contraction templates; `schedule/kernel.py` re-exports them with the other kernel types."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Dot:
    """A MATMUL whose operands are fp8 buffers widened in the group (`x.to(f32) * s`, per-tensor
    `s`), computed as an fp8 dot (`schedule/fp8dot.py`): the operands are the fp8 buffers
    themselves, and the accumulator is multiplied by `scales` (per operand: a literal, or a
    one-element fp32 buffer among `extras`) before the epilogue."""

    scales: tuple[float | str, float | str]


class DotKind(enum.Enum):
    """The int8 dot-product instruction an `Int8Dot` GEMM is built on (codegen/cpp/gemm/int8.py)."""

    VNNI = "vpdpbusd"  # AVX-512 VNNI: u8 x s8 -> s32, 4 products per 32-bit lane
    SDOT = "sdot"  # AArch64 dot product: s8 x s8 -> s32, 4 products per 32-bit lane


@dataclass(frozen=True)
class Int8Dot:
    """A MATMUL of dequantized int8 operands computed as an exact int32 dot product
    (`schedule/int8dot.py`): A = (x - x_zero) * x_scale (x: M x K int8), B = ((w - w_zero) *
    scale)^T (w: N x K int8, nn.Linear's weight; scale per tensor, or per output channel from
    `w_scales`). The epilogue sees v = x_scale * scale[j] * sum_k (x - x_zero)(w - w_zero)."""

    kind: DotKind
    x: str
    x_zero: int
    x_scale: float
    w: str
    w_zero: int
    w_scale: float  # per-tensor scale (1.0 with per-channel scales)
    w_scales: str  # per-channel fp32 scales, N of them ("" when per-tensor)
    mr: int  # register tile: rows x columns (whole vectors of int32 lanes)
    nr: int
    mcb: int = 1  # MR-row slivers per work item (`int8dot.row_slivers`)
