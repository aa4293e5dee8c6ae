"""Quantized linear layers as int8 dot products (`ContractionKernel.int8`).

`dequant(x) @ dequant(w).T` with int8 x (per-tensor zero point and scale) and an int8 weight
(per-tensor zero point, per-tensor or per-output-channel scale) is
`x_scale * w_scale[j] * sum_k (x - x_zero)(w - w_zero)`: the sum is an integer, computed exactly
in int32 by the CPU's int8 dot-product instruction (AVX-512 VNNI `vpdpbusd`: 64 multiply-adds
per instruction, 4x an fp32 FMA's 16; AArch64 `sdot`: 16, 4x NEON's fp32 FMA), the zero points
folded in as row/column sums and the scales applied once per output element before the group's
epilogue. Eager dequantizes to fp32
and sums in fp32, so the two differ by eager's own rounding (docs/semantics.md).

`with_int8_dot(k, graph, extras)` returns `k` with `int8` set where the operands have that form
and the target has the instruction (`DOTS`); every other MATMUL keeps the fp32 template (its prologues
dequantize while packing).
"""

from __future__ import annotations

import dataclasses

from vfuse.ir import DType, Graph, Op
from vfuse.ir.sym import hint
from vfuse.schedule.kernel import ContractionKernel, DotKind, Int8Dot
from vfuse.targets.isa import IsaExtra

# The int32 accumulator holds sum_k (x + 128) * w, at most 255 * 128 * K: exact up to this K.
MAX_K = 1 << 16
MAX_ZERO = 255  # zero points beyond any int8 value's distance are not a quantization
# Per instruction: the target extension, fp32 lanes of the tier, register tile (rows x columns of C).
# VNNI: 24 zmm accumulators, 2 B vectors, 1 broadcast; SDOT: 24 of NEON's 32 q registers, 3 B, 1 A.
DOTS = ((DotKind.VNNI, IsaExtra.VNNI, 16, (12, 32)), (DotKind.SDOT, IsaExtra.DOTPROD, 4, (8, 12)))


@dataclasses.dataclass(frozen=True)
class _Affine:
    buf: str  # the int8 buffer
    zero: int
    scale: float
    scales: str  # per-row fp32 scale buffer, or ""


def with_int8_dot(k: ContractionKernel, graph: Graph, extras: frozenset[IsaExtra]) -> ContractionKernel:
    """`k` computed as an int8 dot product where that is exact and the target has the instruction."""
    dot = next((d for d in DOTS if d[1] in extras and d[2] == k.vector), None)
    if dot is None or k.op is not Op.MATMUL or k.colsum is not None:  # the int8 template has no column sums
        return k
    a, b = graph[k.node].inputs
    ta, tb = graph[a].tensor_type, graph[b].tensor_type
    if ta.rank != 2 or tb.rank != 2:
        return k
    x = _affine(graph, a, 0)
    t = graph[b]
    if t.op is not Op.PERMUTE or tuple(t.attrs["perm"]) != (1, 0):
        return k
    w = _affine(graph, t.inputs[0], tb.shape[1])
    if x is None or w is None or x.scales or not {x.buf, w.buf, w.scales} - {""} <= set(k.extras):
        return k
    if ta.shape[1] > MAX_K:  # last: with a symbolic K it takes a guard, only worth it for an int8 GEMM
        return k
    mr, nr = dot[3]
    mcb = row_slivers(hint(ta.shape[0]), hint(ta.shape[1]), mr, k.caches[1])
    q = Int8Dot(dot[0], x.buf, x.zero, x.scale, w.buf, w.zero, w.scale, w.scales, mr, nr, mcb)
    # Packed once when the int8 weight itself is constant (its scales are read on every call).
    return dataclasses.replace(k, int8=q, prepacked_b=graph[w.buf].op is Op.CONSTANT)


def row_slivers(m: int, k: int, mr: int, l2_bytes: int) -> int:
    """MR-row slivers of packed A per work item of the int8 template: their packed block (K
    rounded up to groups of 4 bytes) fills half of L2 while one B sliver is reused over them."""
    return max(1, min(-(-m // mr), l2_bytes // 2 // (mr * ((k + 3) // 4) * 4)))


def _affine(graph: Graph, v: str, rows: int) -> _Affine | None:
    """`v` as (cast(q) - zero) * scale of an int8 buffer q; with `rows`, the scale may also be
    per row (an fp32 buffer of `rows` values, broadcast along the row)."""
    node = graph[v]
    scale, scales = 1.0, ""
    if node.op is Op.MUL:
        for inner, factor in (node.inputs, node.inputs[::-1]):
            s = _scalar(graph, factor)
            if s is not None:
                scale, node = s, graph[inner]
                break
            if rows and (per_row := _per_row(graph, factor, rows)):
                scales, node = per_row, graph[inner]
                break
        else:
            return None
    zero = 0.0
    if node.op is Op.SUB and (z := _scalar(graph, node.inputs[1])) is not None:
        zero, node = z, graph[node.inputs[0]]
    if node.op is not Op.CAST or node.tensor_type.dtype is not DType.F32 or zero != int(zero):
        return None
    q = graph[node.inputs[0]]
    if q.tensor_type.dtype is not DType.I8 or q.op not in (Op.INPUT, Op.CONSTANT) or abs(zero) > MAX_ZERO:
        return None
    return _Affine(q.name, int(zero), scale, scales)


def _scalar(graph: Graph, v: str) -> float | None:
    n = graph[v]
    if n.op is Op.FULL and n.tensor_type.shape == () and n.tensor_type.dtype is DType.F32:
        return float(n.attrs["value"])
    return None


def _per_row(graph: Graph, v: str, rows: int) -> str:
    """The fp32 buffer of `rows` values that `v` ([rows, 1], maybe a reshape of it) reads, or ""."""
    n = graph[v]
    if n.tensor_type.shape != (rows, 1) or n.tensor_type.dtype is not DType.F32:
        return ""
    if n.op is Op.RESHAPE:
        n = graph[n.inputs[0]]
    ok = n.op in (Op.INPUT, Op.CONSTANT) and n.tensor_type.numel == rows and n.tensor_type.dtype is DType.F32
    return n.name if ok else ""
