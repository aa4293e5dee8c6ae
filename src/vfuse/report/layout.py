"""Graph layout for the HTML report: Graphviz `dot` places the boxes and routes the edges.

The report draws its own boxes, so each graph goes to `dot` as fixed-size empty boxes and comes
back (`-Tjson0`) as positions and edge splines, all graphs of a page in one `dot` run. Without
`dot` (or if it fails) a plain layered layout stands in, and `Layout.engine` says so for the page
to show: rows by longest path from the roots, boxes left to right in the order given, edges as
simple curves that may cross boxes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

GAP_X, GAP_Y, MARGIN = 24.0, 36.0, 12.0
DOT_TIMEOUT_S = 60
POINTS_PER_INCH = 72.0  # Graphviz works in points; the page draws one point as one pixel


@dataclass(frozen=True, slots=True)
class Box:
    """A box's top-left corner and size in pixels."""

    x: float
    y: float
    w: float
    h: float

    def overlaps(self, other: Box) -> bool:
        return (
            self.x < other.x + other.w
            and other.x < self.x + self.w
            and self.y < other.y + other.h
            and other.y < self.y + self.h
        )


@dataclass(frozen=True)
class Spec:
    """A graph to lay out: box sizes (w, h) by id, in a preferred order, and directed edges."""

    sizes: dict[str, tuple[float, float]]
    edges: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    paths: dict[tuple[str, str], str]  # SVG path data of each edge, ending at the head's border
    width: float
    height: float
    engine: str  # "dot", or "fallback" when Graphviz was not available


def layout_all(specs: Sequence[Spec]) -> list[Layout]:
    """Every graph laid out by one `dot` run, or each by `simple_layout` without Graphviz."""
    dot = shutil.which("dot")
    if dot is not None and specs:
        try:
            return graphviz_layouts(specs, dot)
        except (OSError, subprocess.SubprocessError, ValueError, KeyError):
            pass  # a broken Graphviz install: the page still renders, and says which layout it has
    return [simple_layout(s) for s in specs]


def dot_text(specs: Sequence[Spec]) -> str:
    """One DOT digraph per spec, top to bottom, boxes of fixed size without labels."""
    parts = []
    for i, spec in enumerate(specs):
        lines = [
            f"digraph g{i} {{",
            "rankdir=TB; nodesep=0.3; ranksep=0.45;",
            'node [shape=box, fixedsize=true, label=""];',
        ]
        for name, (w, h) in spec.sizes.items():
            lines.append(f'"{name}" [width={w / POINTS_PER_INCH:.4f}, height={h / POINTS_PER_INCH:.4f}];')
        lines += [f'"{a}" -> "{b}";' for a, b in spec.edges]
        parts.append("\n".join(lines) + "\n}\n")
    return "".join(parts)


def graphviz_layouts(specs: Sequence[Spec], dot: str) -> list[Layout]:
    run = subprocess.run(
        [dot, "-Tjson0"], input=dot_text(specs), capture_output=True, text=True, timeout=DOT_TIMEOUT_S, check=True
    )
    docs, pos, decoder = [], 0, json.JSONDecoder()
    text = run.stdout
    while len(docs) < len(specs):
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)
    return [_from_json(doc) for doc in docs]


def _from_json(doc: dict) -> Layout:
    _, _, width, height = (float(v) for v in doc["bb"].split(","))
    names, boxes = {}, {}
    for obj in doc.get("objects", []):
        x, y = (float(v) for v in obj["pos"].split(","))
        w, h = float(obj["width"]) * POINTS_PER_INCH, float(obj["height"]) * POINTS_PER_INCH
        names[obj["_gvid"]] = obj["name"]
        boxes[obj["name"]] = Box(x - w / 2 + MARGIN, height - y - h / 2 + MARGIN, w, h)
    paths = {}
    for edge in doc.get("edges", []):
        paths[(names[edge["tail"]], names[edge["head"]])] = _spline(edge["pos"], height)
    return Layout(boxes, paths, width + 2 * MARGIN, height + 2 * MARGIN, "dot")


def _spline(pos: str, height: float) -> str:
    """Graphviz's "e,x,y p1 p2 ..." (cubic Bezier points, then the arrow tip) as SVG path data."""
    end = None
    points = []
    for part in pos.split():
        if part.startswith("e,"):
            end = part[2:]
        elif not part.startswith("s,"):
            points.append(part)

    def pt(text: str) -> str:
        x, y = (float(v) for v in text.split(","))
        return f"{x + MARGIN:.1f},{height - y + MARGIN:.1f}"

    d = f"M{pt(points[0])}" + "".join(f" C{pt(a)} {pt(b)} {pt(c)}" for a, b, c in _triples(points[1:]))
    return d + (f" L{pt(end)}" if end is not None else "")


def _triples(points: list[str]) -> list[tuple[str, str, str]]:
    return [(points[i], points[i + 1], points[i + 2]) for i in range(0, len(points) - 2, 3)]


def simple_layout(spec: Spec) -> Layout:
    """Rows by longest path from the roots, boxes left to right in spec order, rows centred."""
    rank: dict[str, int] = {}
    preds: dict[str, list[str]] = {n: [] for n in spec.sizes}
    for a, b in spec.edges:
        preds[b].append(a)
    for name in spec.sizes:  # spec order is topological
        rank[name] = 1 + max((rank[p] for p in preds[name] if p in rank), default=-1)
    rows: dict[int, list[str]] = {}
    for name in spec.sizes:
        rows.setdefault(rank[name], []).append(name)
    widths = {r: sum(spec.sizes[n][0] for n in ns) + GAP_X * (len(ns) - 1) for r, ns in rows.items()}
    total_w = max(widths.values(), default=0.0)
    boxes, y = {}, MARGIN
    for r in sorted(rows):
        x = MARGIN + (total_w - widths[r]) / 2
        row_h = max(spec.sizes[n][1] for n in rows[r])
        for n in rows[r]:
            w, h = spec.sizes[n]
            boxes[n] = Box(x, y, w, h)
            x += w + GAP_X
        y += row_h + GAP_Y
    paths = {(a, b): _curve(boxes[a], boxes[b]) for a, b in spec.edges}
    return Layout(boxes, paths, total_w + 2 * MARGIN, max(y - GAP_Y + MARGIN, 0.0), "fallback")


def _curve(a: Box, b: Box) -> str:
    x1, y1, x2, y2 = a.x + a.w / 2, a.y + a.h, b.x + b.w / 2, b.y
    bend = max(20.0, (y2 - y1) / 2)
    return f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
