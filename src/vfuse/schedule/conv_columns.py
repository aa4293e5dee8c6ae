"""The columns a conv template computes per image (the direct path's padded width or compact columns,
the implicit GEMM's OH x OW): shared by the cost of the template (`contraction.library_choice`) and
the schedule's choice of compact columns (`contraction._template_attrs`), which the renderer reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vfuse.ir.shapes import Shape
from vfuse.ir.sym import hint, is_sym
from vfuse.schedule.microtile import compact_conv_columns


def conv_columns(
    attrs: Mapping[str, Any], x_shape: Shape, w_shape: Shape, out_shape: Shape, lanes: int = 16, nr: int = 16
) -> int:
    """Output columns per image the conv template computes: OH x OW, or on the direct path (every conv
    but the stride-1 pointwise one, `codegen/cpp/gemm/conv_direct.py`) OH x `padded_width`, garbage
    columns included (8x8 planes: 72 for 64 outputs), unless it takes compact ones
    (`microtile.compact_conv_columns`)."""
    oh, ow = out_shape[2:]
    if not direct_conv(attrs, w_shape):
        return oh * ow
    wp = padded_width(attrs, x_shape, w_shape)
    return oh * ow if compact_conv_columns(hint(oh), hint(ow), hint(wp), nr, lanes) else oh * wp


def compact_columns(
    attrs: Mapping[str, Any], x_shape: Shape, w_shape: Shape, out_shape: Shape, lanes: int, nr: int
) -> bool:
    """Whether a conv on the direct path takes compact columns: at fixed sizes only (the renderer
    needs the plane's width), where `microtile.compact_conv_columns` says they pay."""
    if not direct_conv(attrs, w_shape) or any(is_sym(d) for s in (x_shape, w_shape, out_shape) for d in s):
        return False
    wp = padded_width(attrs, x_shape, w_shape)
    return compact_conv_columns(out_shape[2], out_shape[3], wp, nr, lanes)


def padded_width(attrs: Mapping[str, Any], x_shape: Shape, w_shape: Shape) -> int:
    """The direct conv's row width (conv_direct._Geom): W plus the gap between rows, or for a column
    stride SW the width of one column phase of the padded row, ceil((W + 2 PW) / SW)."""
    pw, sw = attrs["padding"][1], attrs["stride"][1]
    if tuple(attrs["stride"]) != (1, 1):
        return -(-(x_shape[3] + 2 * pw) // sw)
    return x_shape[3] + max(pw, 2 * pw - attrs["dilation"][1] * (w_shape[3] - 1))


def direct_conv(attrs: Mapping[str, Any], w_shape: Shape) -> bool:
    """Whether the conv template takes its direct path (codegen/cpp/gemm/conv.py: all but the stride-1
    pointwise 1x1 without padding, strided ones over phase planes), whose register tiles and columns
    differ (microtile.py)."""
    pointwise = tuple(w_shape[2:]) == (1, 1) and tuple(attrs["padding"]) == (0, 0)
    return not (pointwise and tuple(attrs["stride"]) == (1, 1))


# The direct path's buffers (codegen/cpp/gemm/conv_direct.py): the per-thread OCg x NR tile lives on the
# stack, the padded copy of the whole batch in scratch; past these the implicit GEMM (no such buffers).
MAX_TILE_FLOATS = 16384
MAX_PADDED_FLOATS = 64 << 20


def direct_fits(
    attrs: Mapping[str, Any], x_shape: Shape, w_shape: Shape, out_shape: Shape, mr: int, nr: int, compact: bool
) -> bool:
    """Whether a conv on the direct path (`direct_conv`) keeps its tile and its padded input within the
    limits, at the hints: the padded plane as conv_direct._Geom lays it out (stride 1: rows of Wp with the
    last row's right padding; strided: one plane per column phase some tap reads), and the reads past
    the last plane (the last sliver's tail plus the largest tap offset)."""
    n, c_in, h, w = (hint(d) for d in x_shape)
    kh, kw = hint(w_shape[2]), hint(w_shape[3])
    oh, ow = hint(out_shape[2]), hint(out_shape[3])
    (ph, pw), (dh, dw), (sh, sw) = attrs["padding"], attrs["dilation"], attrs["stride"]
    taps = [(i * dh, j * dw) for i in range(kh) for j in range(kw)]
    if (sh, sw) == (1, 1):
        wp = w + max(pw, 2 * pw - dw * (kw - 1))
        plane, offs = (h + 2 * ph) * wp + pw, [r * wp + c for r, c in taps]
    else:
        hp, wp = -(-(h + 2 * ph) // sh), -(-(w + 2 * pw) // sw)
        phases = sorted({(r % sh, c % sw) for r, c in taps})
        plane = len(phases) * hp * wp
        at = {p: i * hp * wp for i, p in enumerate(phases)}
        offs = [at[(r % sh, c % sw)] + r // sh * wp + c // sw for r, c in taps]
    cols = oh * (ow if compact and wp > ow else wp)
    slack = max(0, -(-cols // nr) * nr + max(offs) - plane) + 16
    ocg = hint(out_shape[1]) // attrs["groups"]
    mpad = -(-ocg // mr) * mr
    return mpad * nr <= MAX_TILE_FLOATS and n * c_in * plane + slack <= MAX_PADDED_FLOATS
