"""convolution_backward (AOTAutograd's backward of conv2d) as forward convs, no new primitive.

Each gradient is a CONV2D plus layout ops, so it runs as vfuse's conv template (implicit GEMM,
its epilogue fused) or, where the cost model predicts torch's conv2d faster, as a library
contraction (`fusion/library.py`), never as a torch convolution_backward:

* grad_input: conv2d of grad_output with the weight's in/out channels swapped per group and its
  taps flipped, stride 1, dilation d, padding d*(k-1) - p (a negative one crops grad_output).
  With stride s > 1, per stride phase: the inputs r, r + s, ... (per axis) are reached only by
  the taps whose window positions land on the stride, so each of the s*s phases is a stride-1
  conv of those taps over grad_output (no zeros inserted: the useful flops only, s*s fewer than
  a conv over grad_output dilated by s), and the phases are interleaved (CAT, a pointwise
  kernel) and cut to the input's size, which the forward's output may not determine. Where
  both are legal, the target's figures choose between this form and one GEMM + a col2im sum
  (`conv_dgrad_cost.py`, `conv_dgrad_gemm.py`); the choice is recorded for the report.
* grad_weight: the batch/channel swap. Over x viewed as Cg images of G*N channels and grad_output
  as G*Og filters of N channels (Ho x Wo taps), conv2d with stride d, dilation s, padding p and
  G groups gives (Cg, Cout, >= k, >= k): cropped to the kernel and transposed (with fixed sizes,
  x is instead cut and zero-padded where the plane would be longer than the kernel).
* grad_bias: the sum of grad_output over N, H, W.

Only the gradients in output_mask are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx

from vfuse.frontend.conv_dgrad_cost import FormChoice, Shapes, choose, illegal
from vfuse.frontend.conv_dgrad_gemm import grad_input_gemm
from vfuse.frontend.emitter import Emitter, bind, python_scalar
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import permute, reshape, slice_
from vfuse.frontend.registry import lowers
from vfuse.ir import Op
from vfuse.ir.sym import is_sym

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


def _flip_taps(em: Emitter, w: str) -> str:
    """w (O, C, kh, kw) with its taps reversed along both axes: the row-major kh*kw taps
    reversed, one CAT of unit slices (torch runs one copy where a flip per axis took two)."""
    o, c, kh, kw = em.ttype(w).shape
    if kh * kw == 1:
        return w
    flat = reshape(em, w, (o, c, kh * kw))
    flipped = em.emit(Op.CAT, [slice_(em, flat, 2, i, i + 1) for i in reversed(range(kh * kw))], dim=2)
    return reshape(em, flipped, (o, c, kh, kw))


@dataclass(frozen=True, slots=True)
class AxisPhase:
    """One axis of one stride phase of grad_input: the inputs r, r + s, r + 2s, ... get
    taps kh0, kh0 + step, ... (m of them, the ones whose window positions land on the stride),
    which read grad_output e apart: a stride-1 conv with dilation e over grad_output cropped to
    [lo, hi), padded by `pad` each side, whose outputs from `offset` on are the phase's."""

    kh0: int
    step: int
    m: int
    e: int
    lo: int
    hi: int
    pad: int
    offset: int


def axis_phase(r: int, out_len: int, q_len: int, k: int, s: int, p: int, d: int) -> AxisPhase | None:
    """The phase r of one axis (forward stride s, padding p, dilation d, kernel k; grad_output
    `out_len` long, `q_len` phase outputs), or None when no tap reaches it (its gradient is 0)."""
    taps = [kh for kh in range(k) if (r + p - kh * d) % s == 0]
    if not taps:
        return None
    m = len(taps)
    step = taps[1] - taps[0] if m > 1 else 1
    e = d * step // s if m > 1 else 1
    # Input r + s*q gets grad_output[q + t] * w[kh], t = (r + p - kh*d) / s, falling by e per tap:
    # the reversed taps read grad_output[q + a + j*e], j = 0..m-1.
    a = (r + p - taps[-1] * d) // s
    need = q_len + (m - 1) * e
    lo, hi = max(a, 0), min(out_len, a + need)
    if hi <= lo:
        return None  # every tap reads past grad_output: padding only
    left, right = lo - a, a + need - hi
    pad = max(left, right)
    return AxisPhase(taps[0], step, m, e, lo, hi, pad, pad - left)


def _phase(
    em: Emitter, go: str, wt: str, ph: AxisPhase, pw: AxisPhase, q: Pair, groups: int, form: FormChoice | None
) -> str:
    """One phase's gradient (N, C, q[0], q[1]): the phase's taps, reversed, over grad_output."""
    v = slice_(em, slice_(em, go, 2, ph.lo, ph.hi), 3, pw.lo, pw.hi)
    w = slice_(em, wt, 2, ph.kh0, ph.kh0 + (ph.m - 1) * ph.step + 1, ph.step)
    w = _flip_taps(em, slice_(em, w, 3, pw.kh0, pw.kh0 + (pw.m - 1) * pw.step + 1, pw.step))
    pads, recorded = (ph.pad, pw.pad), {} if form is None else {"form": form}
    y = em.emit(Op.CONV2D, (v, w), stride=(1, 1), padding=pads, dilation=(ph.e, pw.e), groups=groups, **recorded)
    return slice_(em, slice_(em, y, 2, ph.offset, ph.offset + q[0]), 3, pw.offset, pw.offset + q[1])


def grad_input(em: Emitter, go: str, w: str, in_hw: Pair, geo: Geometry, form: FormChoice | None = None) -> str:
    """dL/dx: per stride phase (rh, rw), a stride-1 conv of the channel-swapped weight's taps that
    land on that phase, reversed, over grad_output; the s*s phases interleaved (module docstring).
    `form` (the FormChoice that chose this form) is recorded on each conv for the report."""
    out_ch, cg, kh, kw = em.ttype(w).shape
    n, g, (sh, sw) = em.ttype(go).shape[0], geo.groups, geo.stride
    wt = reshape(em, w, (g, out_ch // g, cg, kh, kw))
    wt = reshape(em, permute(em, wt, (0, 2, 1, 3, 4)), (g * cg, out_ch // g, kh, kw))
    q = (-(-in_hw[0] // sh), -(-in_hw[1] // sw))  # phase lengths, the last phases' padded
    axes = [
        [axis_phase(r, em.ttype(go).shape[2 + i], q[i], (kh, kw)[i], geo.stride[i], geo.padding[i], geo.dilation[i])
         for r in range(geo.stride[i])]
        for i in range(2)
    ]  # fmt: skip
    rows = []
    for ph in axes[0]:
        row = []
        for pw in axes[1]:
            if ph is None or pw is None:
                dtype = em.ttype(go).dtype
                y = em.emit(Op.FULL, value=python_scalar(0, dtype), shape=(n, g * cg, *q), dtype=dtype)
            else:
                y = _phase(em, go, wt, ph, pw, q, g, form)
            row.append(reshape(em, y, (n, g * cg, q[0], 1, q[1], 1)))
        rows.append(row[0] if sw == 1 else em.emit(Op.CAT, row, dim=5))
    v = rows[0] if sh == 1 else em.emit(Op.CAT, rows, dim=3)
    v = reshape(em, v, (n, g * cg, q[0] * sh, q[1] * sw))
    return slice_(em, slice_(em, v, 2, 0, in_hw[0]), 3, 0, in_hw[1])


def _window(em: Emitter, v: str, dim: int, lo: int, hi: int) -> str:
    """v's positions [lo, hi) along dim, zeros where they fall outside v (explicit padding)."""
    size, t = em.ttype(v).shape[dim], em.ttype(v)
    if max(lo, 0) >= min(hi, size):  # padding only
        shape = (*t.shape[:dim], hi - lo, *t.shape[dim + 1 :])
        return em.emit(Op.FULL, value=python_scalar(0, t.dtype), shape=shape, dtype=t.dtype)
    parts = []
    for width in (-lo, None, hi - size):
        if width is None:
            parts.append(slice_(em, v, dim, max(lo, 0), min(hi, size)))
        elif width > 0:
            shape = (*t.shape[:dim], width, *t.shape[dim + 1 :])
            parts.append(em.emit(Op.FULL, value=python_scalar(0, t.dtype), shape=shape, dtype=t.dtype))
    return parts[0] if len(parts) == 1 else em.emit(Op.CAT, parts, dim=dim)


def grad_weight(em: Emitter, go: str, x: str, kernel: Pair, geo: Geometry) -> str:
    """dL/dw: conv2d over x with batch and channels exchanged, grad_output as the filters, cropped
    to the kernel. Along an axis where that conv's plane would be longer than the kernel (a
    stride s > 1 reaches positions up to the input's end: 3x3, stride 2 at 16x16 gave a 4x4
    plane, 78 % more flops), x is cut and zero-padded to the positions the taps read instead
    (fixed sizes), so the plane is the kernel itself."""
    n, c, _, _ = em.ttype(x).shape
    _, out_ch, ho, wo = em.ttype(go).shape
    g, pad = geo.groups, []
    for dim, k, o, s, p, d in zip((2, 3), kernel, (ho, wo), geo.stride, geo.padding, geo.dilation, strict=True):
        size = em.ttype(x).shape[dim]
        if is_sym(size) or is_sym(o) or (size + 2 * p - s * (o - 1) - 1) // d + 1 == k:
            pad.append(p)  # stride 1: the padded conv's plane is the kernel
        else:
            x = _window(em, x, dim, -p, (k - 1) * d + (o - 1) * s - p + 1)
            pad.append(0)
    h, w = em.ttype(x).shape[2:]
    xs = reshape(em, x, (n, g, c // g, h, w))
    xs = reshape(em, permute(em, xs, (2, 1, 0, 3, 4)), (c // g, g * n, h, w))
    gs = reshape(em, go, (n, g, out_ch // g, ho, wo))
    gs = reshape(em, permute(em, gs, (1, 2, 0, 3, 4)), (out_ch, n, ho, wo))
    v = em.emit(Op.CONV2D, (xs, gs), stride=geo.dilation, padding=tuple(pad), dilation=geo.stride, groups=g)
    v = slice_(em, slice_(em, v, 2, 0, kernel[0]), 3, 0, kernel[1])
    return permute(em, v, (1, 0, 2, 3))


def _tap_range(out_len: int, in_len: int, tap: int, s: int, p: int, d: int) -> tuple[int, int]:
    """The outputs o whose tap reads input o*s + tap*d - p inside [0, in_len): [lo, hi)."""
    off = tap * d - p
    lo = -(off // s) if off < 0 else 0  # ceil(-off / s)
    hi = min(out_len, (in_len - 1 - off) // s + 1) if in_len - 1 - off >= 0 else 0
    return lo, max(lo, hi)


def grad_weight_1x1(em: Emitter, go: str, x: str, geo: Geometry) -> str:
    """dL/dw of a 1x1 kernel (groups 1) as one GEMM over (N, Ho, Wo): go' (Cout, N*h*w) @
    x' (N*h*w, C), over the outputs that read inside x (padding only adds zeros: go cropped, x
    strided); the permutes are computed in the GEMM's packers, not stored."""
    n, c, h, w = em.ttype(x).shape
    _, out_ch, ho, wo = em.ttype(go).shape
    dtype = em.ttype(go).dtype
    rh, rw = (
        _tap_range(o, i, 0, s, p, 1) for o, i, s, p in zip((ho, wo), (h, w), geo.stride, geo.padding, strict=True)
    )
    if rh[0] == rh[1] or rw[0] == rw[1]:  # every output reads padding only
        return em.emit(Op.FULL, value=python_scalar(0, dtype), shape=(out_ch, c, 1, 1), dtype=dtype)
    k = n * (rh[1] - rh[0]) * (rw[1] - rw[0])
    g = slice_(em, slice_(em, go, 2, *rh), 3, *rw)
    g = reshape(em, permute(em, g, (1, 0, 2, 3)), (out_ch, k))
    xv = x
    for dim, r, s, p in zip((2, 3), (rh, rw), geo.stride, geo.padding, strict=True):
        xv = slice_(em, xv, dim, r[0] * s - p, (r[1] - 1) * s - p + 1, s)
    xv = reshape(em, permute(em, xv, (0, 2, 3, 1)), (k, c))
    return reshape(em, em.emit(Op.MATMUL, (g, xv)), (out_ch, c, 1, 1))


# Legality of the GEMM form (`conv_dgrad_cost.illegal`): more tap planes than this keep the phase
# form: a 7x7's 49 planes exceed the planner's kernel-size cap and the split col2im kernels computed
# wrong values (2x3x16x16, 7 channels, stride 2: garbage; left for the scheduler's owner).
MAX_GEMM_TAPS = 16


def form_of(em: Emitter, go: str, w: str, in_hw: Pair, geo: Geometry) -> FormChoice:
    """grad_input's form: one GEMM and a col2im sum (`frontend/conv_dgrad_gemm.py`) or one
    stride-1 conv per stride phase, whichever the target's figures price lower where both are
    legal (`frontend/conv_dgrad_cost.py`). Measured (2x128x16x16 -> 256 channels, 3x3 stride 2,
    one thread, Zen 3): four phase convs and their CAT 2.79 ms, the GEMM 1.16 + the col2im 0.37 ms."""
    s = Shapes(em.ttype(go).shape, em.ttype(w).shape, in_hw, geo.stride, geo.padding, geo.dilation, geo.groups)
    why = illegal(s, MAX_GEMM_TAPS)
    return FormChoice.legality(why) if why else choose(s, em.hardware())


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
    gi = None
    if mask[0]:
        in_hw = em.ttype(x).shape[2:]
        form = form_of(em, go, w, in_hw, geo)
        if form.gemm:
            gi = grad_input_gemm(em, go, w, in_hw, geo.stride, geo.padding, geo.dilation, form)
        else:
            gi = grad_input(em, go, w, in_hw, geo, form)
    kernel = em.ttype(w).shape[2:]
    # A 1x1 kernel's weight gradient is one GEMM; the swapped conv would be a conv with an
    # Ho x Wo kernel and a 1x1 output plane (2x256x8x8, stride 2: 1.0 ms vs 0.14 ms, one thread).
    one_gemm = geo.groups == 1 and tuple(kernel) == (1, 1)
    gw = None
    if mask[1]:
        gw = grad_weight_1x1(em, go, x, geo) if one_gemm else grad_weight(em, go, x, kernel, geo)
    gb = em.emit(Op.SUM, (go,), axes=(0, 2, 3), keepdim=False) if mask[2] else None
    return gi, gw, gb
