"""The HTML page: well-formed, self-contained, one SVG box per IR node, edges classified by kernel."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from vfuse.fusion.plan import Decision, FusionPlan
from vfuse.fusion.rules import Rule
from vfuse.ir import Graph
from vfuse.report import build_report
from vfuse.report.layout import layer_of, layout

VOID = {"meta", "br", "input", "img", "link", "hr", "col", "area", "base", "source", "wbr"}
# SVG elements the page writes self-closed (<path/>): not expected to have an end tag.
SELF_CLOSED = {"path", "rect", "line", "circle"}


class Collector(HTMLParser):
    """Records every start tag with its attributes and checks start/end tags nest properly."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.scripts: dict[str, str] = {}
        self._script_id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag not in VOID:
            self.stack.append(tag)
        self._script_id = a.get("id", "") if tag == "script" else None

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script_id = None
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self._script_id is not None:
            self.scripts[self._script_id] = self.scripts.get(self._script_id, "") + data

    def with_class(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


def parse(page: str) -> Collector:
    c = Collector()
    c.feed(page)
    c.close()
    assert c.errors == []
    assert c.stack == []
    return c


def test_page_is_well_formed_and_self_contained(graph: Graph, plan: FusionPlan, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    page = build_report(graph, plan, "h100").to_html(path)
    assert path.read_text(encoding="utf-8") == page
    c = parse(page)
    assert [a.get("id") for t, a in c.tags if t == "svg" and a.get("id")] == ["graph"]  # others: legend
    assert not [t for t, a in c.tags if t in ("link", "img", "iframe") or "src" in a]  # nothing fetched
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    assert "{{" not in page  # every placeholder filled


def test_one_svg_node_per_ir_node(graph: Graph, plan: FusionPlan) -> None:
    c = parse(build_report(graph, plan, "h100").to_html())
    nodes = c.with_class("g", "node")
    assert sorted(a["data-node"] for a in nodes) == sorted(n.name for n in graph.nodes)
    groups = {a["data-node"]: a["data-group"] for a in nodes}
    assert (groups["mm"], groups["o"], groups["flip"], groups["x"]) == ("0", "1", "2", "")


def test_edges_fused_materialized_or_input(graph: Graph, plan: FusionPlan) -> None:
    c = parse(build_report(graph, plan, "h100").to_html())
    kinds = {}
    for cls in ("fused", "dram", "input"):
        for a in c.with_class("g", cls):
            kinds[(a["data-from"], a["data-to"])] = cls
    assert len(c.with_class("g", "edge")) == len(kinds) == sum(len(set(n.inputs)) for n in graph.nodes) == 14
    assert {e for e, k in kinds.items() if k == "dram"} == {("g", "m"), ("g", "s"), ("o", "flip")}
    assert {e for e, k in kinds.items() if k == "input"} == {("x", "mm"), ("w", "mm"), ("bias", "bias_b")}
    assert kinds[("mm", "y")] == kinds[("e", "z")] == "fused"


def test_data_block_carries_the_decisions(graph: Graph, plan: FusionPlan) -> None:
    c = parse(build_report(graph, plan, "h100").to_html())
    data = json.loads(c.scripts["report-data"])
    assert [d["rule"] for d in data["decisions"]] == [d.rule for d in plan.decisions]
    assert data["decisions"][3]["accepted"] is False
    assert data["nodes"]["flip"]["op"] == "opaque:flip"
    assert data["groups"]["1"]["nodes"] == ["m", "s", "e", "z", "o"]
    rows = [a for t, a in c.tags if t == "tr" and "data-decision" in a]
    assert [a["data-decision"] for a in rows] == [str(i) for i in range(len(plan.decisions))]


def test_text_from_the_plan_is_escaped(graph: Graph, plan: FusionPlan) -> None:
    evil = Decision(("o",), ("flip",), False, Rule.OPAQUE_ALONE, "ends </script><b>here</b>", None)
    hostile = FusionPlan(graph, "h100", plan.groups, (*plan.decisions, evil))
    page = build_report(graph, hostile, "h100").to_html()
    c = parse(page)
    assert "b" not in [t for t, _ in c.tags]  # the parser saw no injected tag
    assert "ends &lt;/script&gt;&lt;b&gt;here&lt;/b&gt;" in page  # the decision table shows it as text
    assert json.loads(c.scripts["report-data"])["decisions"][-1]["reason"] == "ends </script><b>here</b>"


def test_layout_layers_follow_edges_and_boxes_do_not_overlap(graph: Graph) -> None:
    layer = layer_of(graph)
    for n in graph.nodes:
        for i in n.inputs:
            assert layer[i] < layer[n.name]
    assert (layer["x"], layer["bias"], layer["mm"], layer["bias_b"], layer["flip"]) == (0, 0, 1, 1, 9)
    boxes = list(layout(graph).boxes.values())
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y


def test_recomputed_node_is_striped_with_each_kernel_colour(recompute: tuple[Graph, FusionPlan]) -> None:
    from vfuse.report.colours import kernel_fill

    c = parse(build_report(*recompute, "cpu").to_html())
    (n,) = [a for a in c.with_class("g", "node") if a["data-node"] == "n"]
    assert n["data-group"] == "0"
    stops = [a["stop-color"] for t, a in c.tags if t == "stop"]
    assert stops == [kernel_fill(0)] * 2 + [kernel_fill(1)] * 2
    assert {a["data-to"] for a in c.with_class("g", "fused")} == {"a", "s"}
    data = json.loads(c.scripts["report-data"])
    assert data["nodes"]["n"]["groups"] == [0, 1]


def test_plan_without_kernels_still_renders(graph: Graph) -> None:
    c = parse(build_report(graph, FusionPlan(graph, "cpu", (), ()), "cpu").to_html())
    assert len(c.with_class("g", "node")) == len(graph.nodes)
    assert len(c.with_class("g", "fused")) == 0
