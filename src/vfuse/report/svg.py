"""The HTML report's graph as SVG: one box per kernel that runs, edges for values passed through
memory, and for each kernel a hidden panel with its IR nodes that the page's script shows in
place when the kernel is expanded (moving everything below it down).

Positions come from `layout.py` (Graphviz); this module only draws. Every element carries
data-* attributes the script reads: kernel ids, node names, edge ends and original geometry.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from vfuse.ir import Kind
from vfuse.report.colours import SOURCE_FILL, SOURCE_STROKE, kernel_fill, kernel_stroke
from vfuse.report.layout import Box, Layout, Spec
from vfuse.report.rows import RunKind
from vfuse.report.units import fmt_bytes, fmt_time, op_label

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport, KernelRow

KW, KH = 280.0, 56.0  # a kernel's box
NW, NH = 172.0, 38.0  # an IR node's box inside an expanded kernel
PAD = 10.0  # around an expanded kernel's nodes


def kernel_edges(report: FusionReport) -> dict[tuple[int, int], list[str]]:
    """(producer kernel, consumer kernel) -> the values the consumer reads that the producer last wrote."""
    edges: dict[tuple[int, int], list[str]] = {}
    writer: dict[str, int] = {}
    for k in report.kernels:
        for v in k.inputs:
            if v in writer:
                edges.setdefault((writer[v], k.id), []).append(v)
        for v in k.outputs:
            writer[v] = k.id
    return edges


def kernel_spec(report: FusionReport) -> Spec:
    sizes = {kid(k.id): (KW, KH) for k in report.kernels}
    return Spec(sizes, tuple((kid(a), kid(b)) for a, b in kernel_edges(report)))


def inner_spec(report: FusionReport, k: KernelRow) -> Spec:
    """A kernel's nodes and the values it reads from memory (drawn as inputs)."""
    names = (*k.inputs, *k.nodes)
    sizes = {n: (NW, NH) for n in names}
    inside = set(names)
    edges = tuple((i, n) for n in k.nodes for i in dict.fromkeys(report.graph[n].inputs) if i in inside)
    return Spec(sizes, edges)


def kid(i: int) -> str:
    return f"k{i}"


def graph_svg(report: FusionReport, kernels: Layout, inners: list[Layout]) -> str:
    edges = kernel_edges(report)
    parts = [_edge(kernels, a, b, values) for (a, b), values in edges.items()]
    boxes = [_kernel(report, k, kernels.boxes[kid(k.id)]) for k in report.kernels]
    panels = [_inner(report, k, lay) for k, lay in zip(report.kernels, inners, strict=True)]
    w, h = f"{kernels.width:.0f}", f"{kernels.height:.0f}"
    return (
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}"'
        f' data-w="{w}" data-h="{h}">'
        + _MARKERS
        + '<g class="edges">'
        + "".join(parts)
        + '</g><g class="kernels">'
        + "".join(boxes)
        + '</g><g class="inners">'
        + "".join(panels)
        + "</g></svg>"
    )


_MARKERS = (
    "<defs>"
    + "".join(
        f'<marker id="arrow-{cls}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8"'
        f' markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" class="arrowhead {cls}"/></marker>'
        for cls in ("fused", "dram", "input")
    )
    + "</defs>"
)


def _edge(lay: Layout, a: int, b: int, values: list[str]) -> str:
    d = lay.paths.get((kid(a), kid(b)), "")
    tip = f"#{a} -> #{b} through memory: " + ", ".join(f"%{v}" for v in values)
    return (
        f'<g class="edge dram" data-from="{a}" data-to="{b}"><title>{_esc(tip)}</title>'
        f'<path class="hit" d="{d}"/><path class="line" d="{d}" marker-end="url(#arrow-dram)"/></g>'
    )


def _kernel(report: FusionReport, k: KernelRow, box: Box) -> str:
    torch = k.runs is RunKind.TORCH
    fill, stroke = ("#ffffff", "#374151") if torch else (kernel_fill(k.id), kernel_stroke(k.id))
    cls = "kernel torch" if torch else "kernel"
    out = " · writes output" if any(report.graph.is_output(v) for v in k.outputs) else ""
    title = f"#{k.id} {k.name}" if not torch else f"#{k.id} torch"
    figs = f"{fmt_time(k.time_s)} · {fmt_bytes(k.bytes)}"
    tip = f"{title}: {k.pattern}\n{k.module}\n{len(k.nodes)} ops, {figs}, {k.bound}-bound{out}"
    return (
        f'<g class="{cls}" data-id="{k.id}" data-x="{box.x:.1f}" data-y="{box.y:.1f}" data-w="{box.w:.1f}"'
        f' data-h="{box.h:.1f}" transform="translate({box.x:.1f},{box.y:.1f})" tabindex="0">'
        f"<title>{_esc(tip)}</title>"
        f'<rect width="{box.w:.1f}" height="{box.h:.1f}" rx="7" style="fill:{fill};stroke:{stroke}"/>'
        f'<text x="9" y="16" class="name">{_esc(_clip(title, 24))}</text>'
        f'<text x="{box.w - 8:.1f}" y="16" class="figs" text-anchor="end">{_esc(figs)}</text>'
        f'<text x="9" y="32" class="pattern">{_esc(_clip(k.pattern, 40))}</text>'
        f'<text x="9" y="48" class="module">{_esc(_clip(k.module, 30))}</text>'
        f'<g class="toggle" transform="translate({box.w - 62:.1f},38)"><rect width="54" height="14" rx="3"/>'
        f'<text x="27" y="11" text-anchor="middle">+ {len(k.nodes)} op{"s" if len(k.nodes) != 1 else ""}</text></g></g>'
    )


def _inner(report: FusionReport, k: KernelRow, lay: Layout) -> str:
    w, h = lay.width + 2 * PAD, lay.height + 2 * PAD
    edges = [_inner_edge(report, k, lay, a, b) for a, b in lay.paths]
    nodes = [_node(report, k, name, lay.boxes[name]) for name in (*k.inputs, *k.nodes)]
    return (
        f'<g class="inner" data-id="{k.id}" data-w="{w:.1f}" data-h="{h:.1f}" style="display:none">'
        f'<rect class="panel" width="{w:.1f}" height="{h:.1f}" rx="8" style="stroke:{kernel_stroke(k.id)}"/>'
        f'<g transform="translate({PAD},{PAD})">' + "".join(edges) + "".join(nodes) + "</g></g>"
    )


def _inner_edge(report: FusionReport, k: KernelRow, lay: Layout, a: str, b: str) -> str:
    cls = "fused" if a in k.nodes else ("input" if report.graph[a].kind is Kind.SOURCE else "dram")
    d = lay.paths[(a, b)]
    stroke = f' style="stroke:{kernel_stroke(k.id)}"' if cls == "fused" else ""
    return (
        f'<g class="edge {cls}" data-from="{_esc(a)}" data-to="{_esc(b)}"><path class="line" d="{d}"'
        f' marker-end="url(#arrow-{cls})"{stroke}/></g>'
    )


def _node(report: FusionReport, k: KernelRow, name: str, box: Box) -> str:
    node = report.graph[name]
    read = name not in k.nodes
    fill, stroke = (SOURCE_FILL, SOURCE_STROKE) if read else (kernel_fill(k.id), kernel_stroke(k.id))
    where = _origin(report, name, read)
    tip = f"%{name} = {op_label(node)} : {node.type}\n{where}"
    cls = "node read" if read else "node"
    return (
        f'<g class="{cls}" data-node="{_esc(name)}" data-kernel="{k.id}" transform="translate({box.x:.1f},{box.y:.1f})"'
        f' tabindex="0"><title>{_esc(tip)}</title>'
        f'<rect width="{box.w:.1f}" height="{box.h:.1f}" rx="5" style="fill:{fill};stroke:{stroke}"/>'
        f'<text x="7" y="15" class="name">{_esc(_clip("%" + name, 24))}</text>'
        f'<text x="7" y="30" class="op">{_esc(_clip(f"{op_label(node)} {node.type}", 25))}</text></g>'
    )


def _origin(report: FusionReport, name: str, read: bool) -> str:
    src = report.sources.get(name)
    module = f"from {src.label}" + (f" ({src.line})" if src.line else "") if src is not None else ""
    if not read:
        return module
    maker = [j.id for j in report.kernels if name in j.outputs]
    return ("read from memory, written by " + ", ".join(f"#{i}" for i in maker) if maker else "graph input") + (
        f"; {module}" if module else ""
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)
