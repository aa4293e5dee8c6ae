"""The report as one self-contained HTML page: an SVG dataflow graph, kernel and decision tables.

Everything is inline (CSS from `template.html`, JS from `report.js`, data as JSON) so the file
opens offline and can be attached to an issue. Python lays the graph out and writes the SVG;
the script only wires hover/click to show the decisions that involve a node or an edge.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

from vfuse.fusion.plan import Decision
from vfuse.ir import Kind, Node
from vfuse.report.colours import SOURCE_FILL, SOURCE_STROKE, kernel_fill, kernel_stroke
from vfuse.report.layout import GAP_X, Box, Layout, layout
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time, op_label

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport, KernelRow

_KNOWN_DECISION_FIELDS = {f.name for f in dataclasses.fields(Decision)}


def render_html(report: FusionReport) -> str:
    parts = {
        "title": html.escape(f"vfuse fusion report ({report.target})"),
        "summary": _summary_html(report),
        "svg": graph_svg(report, layout(report.graph)),
        "kernels": _kernel_table_html(report),
        "decisions": _decision_table_html(report),
        "data": _json_for_script(_page_data(report)),
        "script": _asset("report.js"),
    }
    # One pass, so text inside the inserted parts (names, data) is never taken for a placeholder.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("template.html"))


def _asset(name: str) -> str:
    return resources.files("vfuse.report").joinpath(name).read_text(encoding="utf-8")


def group_colours(report: FusionReport) -> dict[int, tuple[str, str]]:
    return {g.id: (kernel_fill(g.id), kernel_stroke(g.id)) for g in report.groups}


def graph_svg(report: FusionReport, lay: Layout) -> str:
    colours = group_colours(report)
    edges = [_edge_svg(report, lay, p, n.name, colours) for n in report.graph.nodes for p in dict.fromkeys(n.inputs)]
    nodes = [_node_svg(report, n, i, lay.boxes[n.name], colours) for i, n in enumerate(report.graph.nodes)]
    w, h = f"{lay.width:.0f}", f"{lay.height:.0f}"
    return (
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
        + _MARKERS
        + '<g class="edges">'
        + "".join(edges)
        + '</g><g class="nodes">'
        + "".join(nodes)
        + "</g></svg>"
    )


_MARKERS = (
    "<defs>"
    + "".join(
        f'<marker id="arrow-{cls}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9"'
        f' markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" class="arrowhead {cls}"/></marker>'
        for cls in ("fused", "dram", "input")
    )
    + "</defs>"
)


def _edge_svg(report: FusionReport, lay: Layout, p: str, c: str, colours: dict[int, tuple[str, str]]) -> str:
    cls = report.edge_kind(p, c)
    (x1, y1), (x2, y2) = lay.boxes[p].right, lay.boxes[c].left
    bend = max(30.0, (x2 - x1) / 2)
    d = f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
    group = report.shared_group(p, c)
    stroke = f' style="stroke:{colours[group.id][1]}"' if group is not None else ""
    value = report.graph[p]
    tip = f"%{p} -> %{c}: {value.type} ({fmt_bytes(value.type.nbytes)}), {_EDGE_WORDS[cls]}"
    # An edge that skips layers runs behind other boxes: drawn fainter, so they stay readable.
    long = " long" if x2 - x1 > 2 * (lay.boxes[p].w + GAP_X) else ""
    return (
        f'<g class="edge {cls}{long}" data-from="{_attr(p)}" data-to="{_attr(c)}" tabindex="0">'
        f"<title>{html.escape(tip)}</title>"
        f'<path class="hit" d="{d}"/>'
        f'<path class="line" d="{d}" marker-end="url(#arrow-{cls})"{stroke}/></g>'
    )


_EDGE_WORDS = {
    "fused": "stays on chip inside one kernel",
    "dram": "materialized: written to DRAM and read back by another kernel",
    "input": "read from DRAM (graph input or constant)",
}


def _node_svg(report: FusionReport, node: Node, index: int, box: Box, colours: dict[int, tuple[str, str]]) -> str:
    groups = report.groups_of(node.name)
    ids = [g.id for g in groups]
    fill, stroke = colours[ids[0]] if ids else (SOURCE_FILL, SOURCE_STROKE)
    stripes = ""
    if len(ids) > 1:  # recomputed in several kernels: one vertical stripe of each kernel's colour
        stripes, fill = _stripes(f"rc{index}", [colours[i][0] for i in ids]), f"url(#rc{index})"
    badge = "k" + ",".join(map(str, ids)) if ids else ("in" if node.kind is Kind.SOURCE else "")
    cls = "node source" if node.kind is Kind.SOURCE else ("node opaque" if node.kind is Kind.OPAQUE else "node")
    where = "; ".join(f"kernel {g.id} ({g.label})" for g in groups) or "not in any kernel"
    where = ("recomputed in " if len(ids) > 1 else "") + where
    tip = f"%{node.name} = {node.op.value} : {node.type}\n{where}" + (f"\nfrom {node.origin}" if node.origin else "")
    return (
        f'<g class="{cls}" data-node="{_attr(node.name)}" data-group="{ids[0] if ids else ""}"'
        f' transform="translate({box.x:.1f},{box.y:.1f})" tabindex="0">'
        f"<title>{html.escape(tip)}</title>{stripes}"
        f'<rect width="{box.w}" height="{box.h}" rx="6" style="fill:{fill};stroke:{stroke}"/>'
        f'<text x="8" y="16" class="name">{html.escape(_clip("%" + node.name, 17 - max(0, len(badge) - 3)))}</text>'
        f'<text x="{box.w - 6}" y="16" class="badge" text-anchor="end">{html.escape(_clip(badge, 9))}</text>'
        f'<text x="8" y="32" class="op">{html.escape(_clip(f"{op_label(node)} {node.type}", 23))}</text></g>'
    )


def _stripes(gradient_id: str, fills: list[str]) -> str:
    """A horizontal gradient with hard stops: equal vertical bands, one per colour."""
    stops = []
    for i, fill in enumerate(fills):
        a, b = i / len(fills), (i + 1) / len(fills)
        stops += [f'<stop offset="{a:.3f}" stop-color="{fill}"/>', f'<stop offset="{b:.3f}" stop-color="{fill}"/>']
    return f'<defs><linearGradient id="{gradient_id}">{"".join(stops)}</linearGradient></defs>'


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def _summary_html(report: FusionReport) -> str:
    speed = fmt_ratio(report.time_unfused_s, report.time_fused_s)
    fallbacks = ", ".join(f"{k} x{v}" for k, v in report.fallbacks.items()) or "none"
    cards = [
        ("ops → kernels", f"{report.num_ops} → {report.num_kernels}", _recompute_note(report)),
        (
            "DRAM bytes",
            f"{fmt_bytes(report.bytes_unfused)} → {fmt_bytes(report.bytes_fused)}",
            f"lower bound {fmt_bytes(report.bytes_lower_bound)}",
        ),
        (
            "predicted time",
            f"{fmt_time(report.time_unfused_s)} → {fmt_time(report.time_fused_s)}",
            f"{speed} faster" if speed else "unfused time not estimated",
        ),
        ("decisions", f"{len(report.accepted)} ✓ / {len(report.rejected)} ✗", "accepted / rejected merges"),
        ("torch fallbacks", str(sum(report.fallbacks.values())), fallbacks),
    ]
    return "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div>'
        f'<div class="s">{html.escape(s)}</div></div>'
        for k, v, s in cards
    )


def _recompute_note(report: FusionReport) -> str:
    n = len(report.recomputed)
    return f"{n} op{'s' if n != 1 else ''} recomputed in several kernels" if n else "compute ops, kernels launched"


def _kernel_table_html(report: FusionReport) -> str:
    colours = group_colours(report)
    head = "".join(
        f"<th>{h}</th>"
        for h in ("#", "label", "kind", "ops", "time", "bytes", "bound", "flops", "pressure", "reads", "writes")
    )
    rows = "".join(_kernel_row_html(g, report.op_chain(g), colours[g.id]) for g in report.groups)
    return f"<table id='kernels'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _kernel_row_html(g: KernelRow, ops: str, colour: tuple[str, str]) -> str:
    cells = [
        f'<span class="swatch" style="background:{colour[0]};border-color:{colour[1]}"></span>{g.id}',
        html.escape(g.label),
        html.escape(g.kind),
        html.escape(ops),
        _num(fmt_time(g.time_s)),
        _num(fmt_bytes(g.bytes)),
        g.bound,
        _num(f"{g.flops:,}"),
        _num(f"{g.pressure:.2f}"),
        html.escape(fmt_names(g.inputs)),
        html.escape(fmt_names(g.outputs)),
    ]
    return f'<tr data-group="{g.id}">' + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>"


def _num(text: str) -> str:
    # Numbers stay on one line and right-aligned so that a column reads as a column.
    return f'<td class="num">{html.escape(text)}</td>'


def _decision_table_html(report: FusionReport) -> str:
    extra = _extra_fields(report.decisions)
    head = "".join(
        f"<th>{html.escape(h)}</th>" for h in ("#", "verdict", "producer", "consumer", "rule", "gain", "reason", *extra)
    )
    rows = "".join(_decision_row_html(i, d, extra) for i, d in enumerate(report.decisions))
    return f"<table id='decisions'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _decision_row_html(i: int, d: Decision, extra: list[str]) -> str:
    verdict = ("accepted" if d.accepted else "rejected") + (" (horizontal)" if d.horizontal else "")
    cells = [
        str(i),
        f'<span class="{"ok" if d.accepted else "no"}">{verdict}</span>',
        html.escape(fmt_names(d.producer)),
        html.escape(fmt_names(d.consumer)),
        f'<td title="{html.escape(d.rule.meaning)}">{html.escape(d.rule.value)}</td>',
        _num("-" if d.gain_s is None else fmt_time(d.gain_s)),
        html.escape(d.reason),
        *(html.escape(str(getattr(d, f))) for f in extra),
    ]
    return f'<tr data-decision="{i}">' + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>"


def _extra_fields(decisions: tuple[Decision, ...]) -> list[str]:
    """Fields a newer planner added to Decision (cost figures, ...): shown without code changes here."""
    if not decisions:
        return []
    return [f.name for f in dataclasses.fields(decisions[0]) if f.name not in _KNOWN_DECISION_FIELDS]


def _page_data(report: FusionReport) -> dict[str, Any]:
    return {
        "nodes": {n.name: _node_data(report, n) for n in report.graph.nodes},
        "groups": {str(g.id): _group_data(g) for g in report.groups},
        "decisions": [_decision_data(d) for d in report.decisions],
    }


def _node_data(report: FusionReport, n: Node) -> dict[str, Any]:
    return {
        "op": op_label(n),
        "type": str(n.type),
        "bytes": fmt_bytes(n.type.nbytes),
        "groups": [g.id for g in report.groups_of(n.name)],
        "origin": n.origin,
        "output": report.graph.is_output(n.name),
    }


def _group_data(g: KernelRow) -> dict[str, Any]:
    return {
        "label": g.label,
        "kind": g.kind,
        "time": fmt_time(g.time_s),
        "bytes": fmt_bytes(g.bytes),
        "bound": g.bound,
        "nodes": list(g.nodes),
    }


def _decision_data(d: Decision) -> dict[str, Any]:
    data = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
    data["gain"] = "-" if d.gain_s is None else fmt_time(d.gain_s)
    data["rule"], data["meaning"] = d.rule.value, d.rule.meaning
    return data


def _json_for_script(data: dict[str, Any]) -> str:
    # "</" inside a <script> would end it early; "<\/" is the same string to JSON.
    return json.dumps(data, default=str, ensure_ascii=False).replace("</", "<\\/")
