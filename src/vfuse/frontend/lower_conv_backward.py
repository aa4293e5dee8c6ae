"""convolution_backward (AOTAutograd's backward of conv2d) as forward convs, no new primitive.

Each gradient is a CONV2D plus layout ops, so it runs as vfuse's conv template (implicit GEMM,
its epilogue fused) or, where the cost model predicts torch's conv2d faster, as a library
contraction (`fusion/library.py`), never as a torch convolution_backward:

* grad_input: conv2d of grad_output with the weight's in/out channels swapped per group and its
  taps flipped, stride 1, dilation d, padding d*(k-1) - p (a negative one crops grad_output).
  With stride s > 1 grad_output is first dilated by s (s - 1 zeros after each element, as CAT
  with zeros: a pointwise kernel), keeping `extra` = (H + 2p - d*(k-1) - 1) % s trailing zeros
  so the result has the input's size even where the forward dropped rows.
* grad_weight: the batch/channel swap. Over x viewed as Cg images of G*N channels and grad_output
  as G*Og filters of N channels (Ho x Wo taps), conv2d with stride d, dilation s, padding p and
  G groups gives (Cg, Cout, >= k, >= k): cropped to the kernel and transposed.
* grad_bias: the sum of grad_output over N, H, W.

Only the gradients in output_mask are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind, python_scalar
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import permute, reshape, slice_
from vfuse.frontend.registry import lowers
from vfuse.ir import Op

aten = torch.ops.aten

Pair = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Geometry:
    """The forward conv's attributes, per spatial axis (H, W)."""

    stride: Pair
    padding: Pair
    dilation: Pair
    groups: int


def _pair(v: Sequence[int]) -> Pair:
    v = [int(i) for i in v]
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _zeros_like_block(em: Emitter, x: str, dim: int, width: int) -> str:
    t = em.ttype(x)
    shape = (*t.shape[:dim], width, *t.shape[dim + 1 :])
    return em.emit(Op.FULL, value=python_scalar(0, t.dtype), shape=shape, dtype=t.dtype)


def _flip(em: Emitter, x: str, dim: int) -> str:
    """x reversed along dim (a kernel's taps: a CAT of its unit slices)."""
    n = em.ttype(x).shape[dim]
    if n == 1:
        return x
    return em.emit(Op.CAT, [slice_(em, x, dim, i, i + 1) for i in reversed(range(n))], dim=dim)


def _dilate(em: Emitter, go: str, geo: Geometry, lengths: Pair) -> str:
    """grad_output with s - 1 zeros after each element per axis, cut to `lengths`."""
    n, c, ho, wo = em.ttype(go).shape
    sh, sw = geo.stride
    if (sh, sw) == (1, 1):
        return go
    v = reshape(em, go, (n, c, ho, 1, wo, 1))
    if sh > 1:
        v = em.emit(Op.CAT, [v, _zeros_like_block(em, v, 3, sh - 1)], dim=3)
    if sw > 1:
        v = em.emit(Op.CAT, [v, _zeros_like_block(em, v, 5, sw - 1)], dim=5)
    v = reshape(em, v, (n, c, ho * sh, wo * sw))
    return slice_(em, slice_(em, v, 2, 0, lengths[0]), 3, 0, lengths[1])


def grad_input(em: Emitter, go: str, w: str, in_hw: Pair, geo: Geometry) -> str:
    """dL/dx: the transposed, flipped weight over the dilated grad_output (module docstring)."""
    out_ch, cg, kh, kw = em.ttype(w).shape
    g = geo.groups
    ho_wo = em.ttype(go).shape[2:]
    extent = [geo.dilation[i] * (k - 1) for i, k in enumerate((kh, kw))]
    extra = [(in_hw[i] + 2 * geo.padding[i] - extent[i] - 1) % geo.stride[i] for i in range(2)]
    lengths = ((ho_wo[0] - 1) * geo.stride[0] + 1 + extra[0], (ho_wo[1] - 1) * geo.stride[1] + 1 + extra[1])
    v = _dilate(em, go, geo, lengths)
    pads = [extent[i] - geo.padding[i] for i in range(2)]
    for i, p in enumerate(pads):
        if p < 0:  # the forward padded past the kernel's reach: those outputs touch no input
            v = slice_(em, v, 2 + i, -p, lengths[i] + p)
    wt = reshape(em, w, (g, out_ch // g, cg, kh, kw))
    wt = reshape(em, permute(em, wt, (0, 2, 1, 3, 4)), (g * cg, out_ch // g, kh, kw))
    wt = _flip(em, _flip(em, wt, 2), 3)
    return em.emit(
        Op.CONV2D,
        (v, wt),
        stride=(1, 1),
        padding=(max(pads[0], 0), max(pads[1], 0)),
        dilation=geo.dilation,
        groups=g,
    )


def grad_weight(em: Emitter, go: str, x: str, kernel: Pair, geo: Geometry) -> str:
    """dL/dw: conv2d over x with batch and channels exchanged, grad_output as the filters."""
    n, c, h, w = em.ttype(x).shape
    _, out_ch, ho, wo = em.ttype(go).shape
    g = geo.groups
    xs = reshape(em, x, (n, g, c // g, h, w))
    xs = reshape(em, permute(em, xs, (2, 1, 0, 3, 4)), (c // g, g * n, h, w))
    gs = reshape(em, go, (n, g, out_ch // g, ho, wo))
    gs = reshape(em, permute(em, gs, (1, 2, 0, 3, 4)), (out_ch, n, ho, wo))
    v = em.emit(Op.CONV2D, (xs, gs), stride=geo.dilation, padding=geo.padding, dilation=geo.stride, groups=g)
    v = slice_(em, slice_(em, v, 2, 0, kernel[0]), 3, 0, kernel[1])
    return permute(em, v, (1, 0, 2, 3))


def _check(em: Emitter, go: str, x: str, w: str) -> None:
    types = [em.ttype(v) for v in (go, x, w)]
    if any(t.rank != 4 for t in types):
        raise Fallback("convolution_backward of other than 2-D convolution")
    if len({t.dtype for t in types}) != 1 or not types[0].dtype.is_float:
        raise Fallback(f"convolution_backward of {[t.dtype.value for t in types]}")
    if any(t.numel == 0 for t in types):
        raise Fallback("convolution_backward of an empty tensor")


@lowers(aten.convolution_backward.default)
def lower_convolution_backward(em: Emitter, node: torch.fx.Node) -> tuple[str | None, str | None, str | None]:
    a = bind(node)
    go, x, w = em.value(a["grad_output"]), em.value(a["input"]), em.value(a["weight"])
    if a["transposed"]:
        raise Fallback("convolution_backward of a transposed convolution")
    _check(em, go, x, w)
    geo = Geometry(_pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"]), int(a["groups"]))
    mask = list(a["output_mask"])
    gi = grad_input(em, go, w, em.ttype(x).shape[2:], geo) if mask[0] else None
    gw = grad_weight(em, go, x, em.ttype(w).shape[2:], geo) if mask[1] else None
    gb = em.emit(Op.SUM, (go,), axes=(0, 2, 3), keepdim=False) if mask[2] else None
    return gi, gw, gb
