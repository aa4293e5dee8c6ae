"""Kernel colours shared by the HTML and Graphviz renderings, so both show kernel k alike."""

from __future__ import annotations

import colorsys

# ColorBrewer Set3 (qualitative, print-friendly pastels) without its grey, which marks inputs.
PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#e5c494",
)  # fmt: skip
SOURCE_FILL, SOURCE_STROKE = "#eceff3", "#6b7280"


def kernel_fill(kernel_id: int) -> str:
    """The palette first; beyond it, golden-angle hues keep consecutive ids apart."""
    if kernel_id < len(PALETTE):
        return PALETTE[kernel_id]
    r, g, b = colorsys.hls_to_rgb((kernel_id * 0.381966) % 1.0, 0.82, 0.65)
    return _hex(r, g, b)


def kernel_stroke(kernel_id: int) -> str:
    """The fill's hue, darkened enough to read as an outline and as a fused edge's colour."""
    fill = kernel_fill(kernel_id)
    h, _, s = colorsys.rgb_to_hls(*(int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5)))
    return _hex(*colorsys.hls_to_rgb(h, 0.32, min(1.0, s + 0.2)))


def _hex(r: float, g: float, b: float) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in (r, g, b))
