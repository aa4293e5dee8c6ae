"""The conv template (`Op.CONV2D`): an implicit GEMM, the group's epilogue on the accumulator.

Per conv group (the batch index of the GEMM): rows are output pixels (image, oh, ow), columns
the group's output channels, K runs over (input channel, kh, kw), the weight's own row-major
order, so a weight tile is a plain [BK, BN] read of OIHW. The input tile is gathered from the
IR's NCHW tensor: element (pixel, k) is x[n, c, oh * stride - pad + kh * dilation, ...], masked
outside the image (zero padding), so no padded copy or im2col buffer is ever stored. Rows walk
ow fastest, so a stride-1 conv reads each input row contiguously.
"""

from __future__ import annotations

import math

from vfuse.codegen.triton.gemm import Section, dot_lines, epilogue, loops_of, signature_params, tile_order
from vfuse.codegen.triton.names import param
from vfuse.codegen.triton.writer import FaultTable
from vfuse.schedule.kernel import ContractionKernel, Program


def render_conv(k: ContractionKernel, program: Program, faults: FaultTable) -> tuple[list[str], list[str], list[str]]:
    """(function lines, parameter names, values bound) of a CONV2D template."""
    g = k.gpu
    assert g is not None
    nb, c, h, w = k.shapes[0]
    oc, cg, kh, kw = k.shapes[1]
    _, _, oh, ow = k.out_shape
    (sh, sw), (ph, pw), (dh, dw) = (tuple(k.attrs[a]) for a in ("stride", "padding", "dilation"))
    groups = int(k.attrs["groups"])
    ocg, kk, m, ohw = oc // groups, cg * kh * kw, nb * oh * ow, oh * ow
    tiles_m, tiles_n = -(-m // g.block_m), -(-ocg // g.block_n)
    x, wt = param(k.operands[0]), param(k.operands[1])
    pid = "tl.program_id(0).to(tl.int64)" if g.wide else "tl.program_id(0)"
    cast = ".to(tl.float32)" if g.dot == "fp32" else ""
    body = [f"pid_ = {pid}", *tile_order(tiles_m, tiles_n, g.group_m)]
    body += [
        f"rm_ = tm_ * {g.block_m} + tl.arange(0, {g.block_m})",
        f"rn_ = tn_ * {g.block_n} + tl.arange(0, {g.block_n})",
        f"mm_ = rm_ < {m}",
        f"mn_ = rn_ < {ocg}",
        f"n_ = (rm_ // {ohw})[:, None]",
        f"p_ = rm_ % {ohw}",
        f"ih0_ = ((p_ // {ow}) * {sh} - {ph})[:, None]",
        f"iw0_ = ((p_ % {ow}) * {sw} - {pw})[:, None]",
        f"xb_ = (n_ * {c} + bz_ * {cg}) * {h * w}",
        f"wb_ = (bz_ * {ocg} + rn_[None, :]) * {kk}",
        f"acc_ = tl.full([{g.block_m}, {g.block_n}], 0.0, tl.float32)",
        f"for k0_ in range({-(-kk // g.block_k)}):",
        f"    rk_ = k0_ * {g.block_k} + tl.arange(0, {g.block_k})",
        f"    mk_ = rk_ < {kk}",
        f"    ci_ = (rk_ // {kh * kw})[None, :]",
        f"    ih_ = ih0_ + ((rk_ // {kw}) % {kh})[None, :] * {dh}",
        f"    iw_ = iw0_ + (rk_ % {kw})[None, :] * {dw}",
        f"    am_ = mm_[:, None] & mk_[None, :] & (ih_ >= 0) & (ih_ < {h}) & (iw_ >= 0) & (iw_ < {w})",
        f"    a_ = tl.load({x} + xb_ + ci_ * {h * w} + ih_ * {w} + iw_, mask=am_, other=0.0){cast}",
        f"    b_ = tl.load({wt} + wb_ + rk_[:, None], mask=mk_[:, None] & mn_[None, :], other=0.0){cast}",
    ]
    lines = ["    " + ln for ln in body] + dot_lines("a_", "b_", g.dot, 2)
    lines += ["    v = acc_", "    om_ = mm_[:, None] & mn_[None, :]"]
    sec = Section(k, program, faults)
    if tuple(k.space) == tuple(k.out_shape):
        loops = loops_of(k.space)
        groups = [("en_", "n_", loops[:1]), ("eo_", f"(bz_ * {ocg} + rn_)[None, :]", loops[1:2])]
        groups.append(("ep_", "p_[:, None]", loops[2:]))
        lines += epilogue(sec, "", "", 0, "om_", groups=groups)
    else:  # a reshape of the output: one flat index
        flat = f"(n_ * {oc} + (bz_ * {ocg} + rn_)[None, :]) * {ohw} + p_[:, None]"
        lines += epilogue(sec, "", "", 0, "om_", groups=[("ef_", flat, loops_of(k.space))])
    assert math.prod(k.space) == math.prod(k.out_shape)
    names, values = signature_params(k, program)
    return lines, names, values
