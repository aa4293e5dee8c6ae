"""convolution_backward's data gradient as one GEMM and a col2im sum (groups 1).

col = W^T (Cin*kh*kw, Cout) @ grad_output (Cout, N*Ho*Wo): every flop useful, whatever the stride
and the plane (the conv forms pay for a small plane's padded row ends, and a strided conv's
phases are s*s small convs and a CAT). Tap (i, j)'s rows of col are the gradient of inputs
(oh*s - p + i*d, ow*s - p + j*d): each tap's plane is spread to the input's grid (zeros between
the strided positions, cropped or zero-padded at the edges) and the kh*kw planes added, a
pointwise kernel the planner fuses with what reads the gradient. The MATMUL is priced against
torch's library like any GEMM (`fusion/library.py`).
"""

from __future__ import annotations

from vfuse.frontend.emitter import Emitter, python_scalar
from vfuse.frontend.lower_layout import permute, reshape, slice_
from vfuse.ir import Op

Pair = tuple[int, int]


def _zeros_like_axis(em: Emitter, v: str, dim: int, width: int) -> str:
    t = em.ttype(v)
    shape = (*t.shape[:dim], width, *t.shape[dim + 1 :])
    return em.emit(Op.FULL, value=python_scalar(0, t.dtype), shape=shape, dtype=t.dtype)


def _spread(em: Emitter, v: str, dim: int, first: int, step: int, size: int) -> str:
    """v's positions q along `dim` placed at first + q*step of an axis `size` long, zeros elsewhere."""
    t = em.ttype(v)
    count = t.shape[dim]
    if step > 1:  # interleave step - 1 zeros after each position: (.., q, 1) ++ (.., q, step-1)
        shape = (*t.shape[: dim + 1], 1, *t.shape[dim + 1 :])
        v = reshape(em, v, shape)
        v = em.emit(Op.CAT, [v, _zeros_like_axis(em, v, dim + 1, step - 1)], dim=dim + 1)
        v = reshape(em, v, (*t.shape[:dim], count * step, *t.shape[dim + 1 :]))
    length = em.ttype(v).shape[dim]
    lo, hi = -first, size - first  # v's positions [lo, hi) are the axis's [0, size)
    parts = []
    if lo < 0:
        parts.append(_zeros_like_axis(em, v, dim, min(-lo, size)))
    if max(lo, 0) < min(hi, length):
        parts.append(slice_(em, v, dim, max(lo, 0), min(hi, length)))
    if hi > max(lo, length):
        parts.append(_zeros_like_axis(em, v, dim, hi - max(lo, length)))
    return parts[0] if len(parts) == 1 else em.emit(Op.CAT, parts, dim=dim)


def reaches(out_len: int, in_len: int, tap: int, s: int, p: int, d: int) -> bool:
    """Whether any output's tap `tap` reads inside the input (else the tap adds nothing)."""
    first = tap * d - p
    return first + (out_len - 1) * s >= 0 and first < in_len


def grad_input_gemm(em: Emitter, go: str, w: str, in_hw: Pair, stride: Pair, padding: Pair, dilation: Pair) -> str:
    """dL/dx (N, Cin, H, W) of a groups-1 conv: one MATMUL, then the taps' planes summed."""
    out_ch, cin, kh, kw = em.ttype(w).shape
    n, _, ho, wo = em.ttype(go).shape
    a = permute(em, reshape(em, w, (out_ch, cin * kh * kw)), (1, 0))
    b = reshape(em, permute(em, go, (1, 0, 2, 3)), (out_ch, n * ho * wo))
    col = reshape(em, em.emit(Op.MATMUL, (a, b)), (cin, kh * kw, n, ho, wo))
    total = None
    for i in range(kh):
        for j in range(kw):
            if not (
                reaches(ho, in_hw[0], i, stride[0], padding[0], dilation[0])
                and reaches(wo, in_hw[1], j, stride[1], padding[1], dilation[1])
            ):
                continue
            t = reshape(em, slice_(em, col, 1, i * kw + j, i * kw + j + 1), (cin, n, ho, wo))
            t = permute(em, t, (1, 0, 2, 3))
            t = _spread(em, t, 2, i * dilation[0] - padding[0], stride[0], in_hw[0])
            t = _spread(em, t, 3, j * dilation[1] - padding[1], stride[1], in_hw[1])
            total = t if total is None else em.emit(Op.ADD, (total, t))
    if total is None:  # every tap reads padding only
        dtype = em.ttype(go).dtype
        return em.emit(Op.FULL, value=python_scalar(0, dtype), shape=(n, cin, *in_hw), dtype=dtype)
    return total
