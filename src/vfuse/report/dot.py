"""The report as Graphviz text: one `subgraph cluster_<id>` per kernel that runs, edges styled like the HTML.

Inputs and constants stay outside every cluster; a node recomputed in several kernels appears
once per kernel (dashed after the first). Edges between kernels (values
materialized to DRAM) are dashed red, edges inside a kernel solid: `dot -Tsvg` then shows the
kernel boundaries without the reader having to compare node colours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfuse.ir import Kind, Node
from vfuse.report.colours import SOURCE_FILL, kernel_fill, kernel_stroke
from vfuse.report.units import fmt_bytes, fmt_time, op_label

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport, KernelRow

_EDGE_STYLE = {
    "fused": "",
    "dram": ' [color="#b91c1c", style=dashed, penwidth=2]',
    "input": ' [color="#6b7280", style=dotted]',
}


def quote(text: str) -> str:
    """A DOT double-quoted string; newlines become DOT's centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def node_label(node: Node) -> str:
    return f"%{node.name}\n{op_label(node)} : {node.type}"


def render_dot(report: FusionReport) -> str:
    graph = report.graph
    lines = [
        "digraph vfuse {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10, fillcolor="#ffffff"];',
    ]
    for n in graph.nodes:
        if not report.kernels_of(n.name):
            fill = SOURCE_FILL if n.kind is Kind.SOURCE else "#ffffff"
            lines.append(f"  {quote(n.name)} [label={quote(node_label(n))}, fillcolor={quote(fill)}];")
    for k in report.kernels:
        lines += _cluster(report, k)
    lines += [f"  {edge}" for n in graph.nodes for edge in _edges_into(report, n)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def node_id(report: FusionReport, name: str, kernel: KernelRow | None) -> str:
    """The DOT id of `name` as computed in `kernel`: a node recomputed in several kernels gets
    a copy in each cluster after its first (Graphviz puts a node in one cluster only)."""
    first = report.kernel_of(name)
    return name if kernel is None or first is None or first.id == kernel.id else f"{name}@k{kernel.id}"


def _edges_into(report: FusionReport, n: Node) -> list[str]:
    """Edges into every copy of `n`; an input computed in the same kernel comes from its copy there."""
    edges = []
    for kernel in report.kernels_of(n.name) or (None,):
        dst = quote(node_id(report, n.name, kernel))
        for p in dict.fromkeys(n.inputs):
            local = kernel is not None and p in kernel.nodes
            src = quote(node_id(report, p, kernel if local else None))
            kind = "fused" if local else ("input" if report.graph[p].kind is Kind.SOURCE else "dram")
            edges.append(f"{src} -> {dst}{_EDGE_STYLE[kind]};")
    return edges


def _cluster(report: FusionReport, g: KernelRow) -> list[str]:
    where = f"\n{g.module}" if g.module else ""
    title = f"#{g.id} {g.name}: {g.pattern}{where}\n{fmt_time(g.time_s)}, {fmt_bytes(g.bytes)}, {g.bound}-bound"
    lines = [
        f"  subgraph cluster_{g.id} {{",
        f"    label={quote(title)};",
        '    style="rounded,filled"; color="#9ca3af";',
        f'    fillcolor="{kernel_fill(g.id)}40";',  # the node colour at 25% opacity
        f'    node [fillcolor="{kernel_fill(g.id)}", color="{kernel_stroke(g.id)}"];',
    ]
    for name in g.nodes:
        nid = node_id(report, name, g)
        copy = ', style="rounded,filled,dashed"' if nid != name else ""
        label = node_label(report.graph[name]) + ("\n(recomputed)" if copy else "")
        lines.append(f"    {quote(nid)} [label={quote(label)}{copy}];")
    lines.append("  }")
    return lines
