"""The conv template (`Op.CONV2D`): an implicit GEMM, the group's epilogue on the accumulator.

Per conv group (the batch index of the GEMM): rows are output pixels (image, oh, ow), columns
the group's output channels. The schedule decides how x and w are read (`GpuTiles.layout`):

- NHWC: x and w are bound channels-last, so x is NHWC memory and w OHWI, a [Cout, KH*KW*Cin]
  matrix whose K runs over (kh, kw, cin). Element (pixel, k) of the A tile is
  x[n, oh * stride - pad + kh * dilation, ..., cin]: one row offset per pixel and tap plus a run
  of contiguous channels. With `tap_steps` (the K step divides the channels) a step stays within
  one tap: the mask is per pixel, the channel run is `arange(block_k)`, and the loads are 16-byte
  vectors; otherwise (3 input channels, ...) the tap is decoded per K lane.
- NCHW: the IR's row-major x and OIHW w, K over (cin, kh, kw), w's own order: x is gathered.

Masked outside the image (zero padding): no padded copy or im2col buffer is ever stored.
"""

from __future__ import annotations

import math

from vfuse.codegen.triton.gemm import Section, dot_lines, epilogue, loops_of, signature_params, tile_order
from vfuse.codegen.triton.names import param
from vfuse.codegen.triton.writer import FaultTable
from vfuse.schedule.gpu_types import ConvLayout, GpuLaunch
from vfuse.schedule.kernel import ContractionKernel, Program


def render_conv(k: ContractionKernel, program: Program, faults: FaultTable) -> tuple[list[str], list[str], list[str]]:
    """(function lines, parameter names, values bound) of a CONV2D template."""
    g = k.gpu
    assert g is not None
    oc, cg, kh, kw = k.shapes[1]
    _, _, oh, ow = k.out_shape
    (sh, sw), (ph, pw) = (tuple(k.attrs[a]) for a in ("stride", "padding"))
    ocg, m, ohw = oc // int(k.attrs["groups"]), k.out_shape[0] * oh * ow, oh * ow
    tiles_m, tiles_n = -(-m // g.block_m), -(-ocg // g.block_n)
    pid = "tl.program_id(0).to(tl.int64)" if g.wide else "tl.program_id(0)"
    body = [f"pid_ = {pid}", *tile_order(tiles_m, tiles_n, g.group_m)]
    body += [
        f"rm_ = tm_ * {g.block_m} + tl.arange(0, {g.block_m})",
        f"rn_ = tn_ * {g.block_n} + tl.arange(0, {g.block_n})",
        f"mm_ = rm_ < {m}",
        f"mn_ = rn_ < {ocg}",
        f"nv_ = rm_ // {ohw}",
        "n_ = nv_[:, None]",
        f"p_ = rm_ % {ohw}",
        f"ih0_ = (p_ // {ow}) * {sh} - {ph}",
        f"iw0_ = (p_ % {ow}) * {sw} - {pw}",
        f"wb_ = (bz_ * {ocg} + rn_[None, :]) * {cg * kh * kw}",
        f"acc_ = tl.full([{g.block_m}, {g.block_n}], 0.0, tl.float32)",
    ]
    if g.layout is ConvLayout.NHWC:
        body += _nhwc_taps(k) if g.tap_steps else _nhwc_lanes(k)
    else:
        body += _nchw(k)
    lines = ["    " + ln for ln in body] + dot_lines("a_", "b_", g.dot, 2)
    lines += ["    v = acc_", "    om_ = mm_[:, None] & mn_[None, :]"]
    return lines + _epilogue(k, program, faults, ocg), *signature_params(k, program)


def _cast(k: ContractionKernel) -> str:
    assert k.gpu is not None
    return ".to(tl.float32)" if k.gpu.dot == "fp32" else ""


def _b_tile(k: ContractionKernel, mask: str) -> str:
    """w's [BK, BN] tile: its rows (K) are contiguous in both layouts (OIHW's or OHWI's own order)."""
    return f"    b_ = tl.load({param(k.operands[1])} + wb_ + rk_[:, None], mask={mask}, other=0.0){_cast(k)}"


def _geometry(k: ContractionKernel) -> tuple[GpuLaunch, tuple[int, int, int], tuple[int, int, int], tuple[int, int]]:
    """The launch, x's (C, H, W), the weight's (Cin per group, KH, KW) and the dilation."""
    assert k.gpu is not None
    _, c, h, w = k.shapes[0]
    _, cg, kh, kw = k.shapes[1]
    dh, dw = tuple(k.attrs["dilation"])
    return k.gpu, (c, h, w), (cg, kh, kw), (dh, dw)


def _nhwc_taps(k: ContractionKernel) -> list[str]:
    """K steps of `block_k` channels within one (kh, kw) tap: a per-pixel offset and mask, the
    channels a contiguous run (one 16-byte load per 8 bf16 lanes)."""
    g, (c, h, w), (cg, kh, kw), (dh, dw) = _geometry(k)
    per = cg // g.block_k  # steps per tap
    return [
        f"for k0_ in range({kh * kw * per}):",
        f"    tap_ = k0_ // {per}",
        f"    ih_ = ih0_ + (tap_ // {kw}) * {dh}",
        f"    iw_ = iw0_ + (tap_ % {kw}) * {dw}",
        f"    ok_ = mm_ & (ih_ >= 0) & (ih_ < {h}) & (iw_ >= 0) & (iw_ < {w})",
        f"    row_ = ((nv_ * {h} + ih_) * {w} + iw_) * {c} + bz_ * {cg} + (k0_ % {per}) * {g.block_k}",
        f"    rk_ = k0_ * {g.block_k} + tl.arange(0, {g.block_k})",
        f"    a_ = tl.load({param(k.operands[0])} + row_[:, None] + tl.arange(0, {g.block_k})[None, :],"
        f" mask=ok_[:, None], other=0.0){_cast(k)}",
        _b_tile(k, "mn_[None, :]"),
    ]


def _nhwc_lanes(k: ContractionKernel) -> list[str]:
    """NHWC with a K step spanning taps (channels not a multiple of 16): each K lane decodes its
    (kh, kw, cin); runs of the group's channels are still contiguous."""
    g, (c, h, w), (cg, kh, kw), (dh, dw) = _geometry(k)
    kk = cg * kh * kw
    return [
        f"for k0_ in range({-(-kk // g.block_k)}):",
        f"    rk_ = k0_ * {g.block_k} + tl.arange(0, {g.block_k})",
        f"    mk_ = rk_ < {kk}",
        f"    tap_ = rk_ // {cg}",
        f"    ih_ = ih0_[:, None] + ((tap_ // {kw}) * {dh})[None, :]",
        f"    iw_ = iw0_[:, None] + ((tap_ % {kw}) * {dw})[None, :]",
        f"    am_ = mm_[:, None] & mk_[None, :] & (ih_ >= 0) & (ih_ < {h}) & (iw_ >= 0) & (iw_ < {w})",
        f"    a_ = tl.load({param(k.operands[0])} + ((n_ * {h} + ih_) * {w} + iw_) * {c} + bz_ * {cg}"
        f" + (rk_ % {cg})[None, :], mask=am_, other=0.0){_cast(k)}",
        _b_tile(k, "mk_[:, None] & mn_[None, :]"),
    ]


def _nchw(k: ContractionKernel) -> list[str]:
    """The IR's NCHW x gathered at (cin, kh, kw) per K lane; rows walk ow fastest, so a stride-1
    conv reads each input row contiguously."""
    g, (c, h, w), (cg, kh, kw), (dh, dw) = _geometry(k)
    kk = cg * kh * kw
    return [
        f"xb_ = (n_ * {c} + bz_ * {cg}) * {h * w}",
        f"for k0_ in range({-(-kk // g.block_k)}):",
        f"    rk_ = k0_ * {g.block_k} + tl.arange(0, {g.block_k})",
        f"    mk_ = rk_ < {kk}",
        f"    ci_ = (rk_ // {kh * kw})[None, :]",
        f"    ih_ = ih0_[:, None] + ((rk_ // {kw}) % {kh})[None, :] * {dh}",
        f"    iw_ = iw0_[:, None] + (rk_ % {kw})[None, :] * {dw}",
        f"    am_ = mm_[:, None] & mk_[None, :] & (ih_ >= 0) & (ih_ < {h}) & (iw_ >= 0) & (iw_ < {w})",
        f"    a_ = tl.load({param(k.operands[0])} + xb_ + ci_ * {h * w} + ih_ * {w} + iw_, mask=am_, other=0.0)"
        + _cast(k),
        _b_tile(k, "mk_[:, None] & mn_[None, :]"),
    ]


def _epilogue(k: ContractionKernel, program: Program, faults: FaultTable, ocg: int) -> list[str]:
    """The epilogue and the store into the NCHW (row-major) output, or a reshape of it."""
    oc, ohw = k.out_shape[1], k.out_shape[2] * k.out_shape[3]
    sec = Section(k, program, faults)
    assert math.prod(k.space) == math.prod(k.out_shape)
    if tuple(k.space) == tuple(k.out_shape):
        loops = loops_of(k.space)
        groups = [("en_", "n_", loops[:1]), ("eo_", f"(bz_ * {ocg} + rn_)[None, :]", loops[1:2])]
        groups.append(("ep_", "p_[:, None]", loops[2:]))
        return epilogue(sec, "", "", 0, "om_", groups=groups)
    flat = f"(n_ * {oc} + (bz_ * {ocg} + rn_)[None, :]) * {ohw} + p_[:, None]"  # a reshape of the output
    return epilogue(sec, "", "", 0, "om_", groups=[("ef_", flat, loops_of(k.space))])
