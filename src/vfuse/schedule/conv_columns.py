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
    """Output columns per image the conv template computes: OH x OW, or for a stride-1 conv that is not
    1x1 (the direct path, `codegen/cpp/gemm/conv_direct.py`) OH x (W + gap), garbage columns included
    (8x8 planes: 72 for 64 outputs), unless it takes compact ones (`microtile.compact_conv_columns`)."""
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
    """The direct conv's row width: W plus the gap between rows (conv_direct._Geom)."""
    pw = attrs["padding"][1]
    return x_shape[3] + max(pw, 2 * pw - attrs["dilation"][1] * (w_shape[3] - 1))


def direct_conv(attrs: Mapping[str, Any], w_shape: Shape) -> bool:
    """Whether the conv template takes its direct path (codegen/cpp/gemm/conv.py: stride 1 and not the
    pointwise 1x1 without padding), whose register tiles and columns differ (microtile.py)."""
    pointwise = tuple(w_shape[2:]) == (1, 1) and tuple(attrs["padding"]) == (0, 0)
    return tuple(attrs["stride"]) == (1, 1) and not pointwise
