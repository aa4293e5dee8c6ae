"""The HTML page: well-formed and self-contained; one box per kernel that runs, each kernel's nodes in
a panel the script expands; edges classified; Graphviz layout without overlaps, a visible fallback."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from vfuse.fusion.plan import Decision, FusionPlan
from vfuse.fusion.rules import Rule
from vfuse.ir import Graph
from vfuse.report import build_report, layout
from vfuse.report.layout import Box, Spec, layout_all

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


def test_one_box_per_kernel_and_its_nodes_in_a_hidden_panel(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    c = parse(r.to_html())
    assert [a["data-id"] for a in c.with_class("g", "kernel")] == ["0", "1", "2"]
    assert len(c.with_class("g", "torch")) == 1  # the flip runs through torch
    panels = c.with_class("g", "inner")
    assert [a["data-id"] for a in panels] == ["0", "1", "2"] and all("display:none" in a["style"] for a in panels)
    by_kernel: dict[str, list[str]] = {}
    for a in c.with_class("g", "node"):
        by_kernel.setdefault(a["data-kernel"], []).append(a["data-node"])
    # Each panel: the values the kernel reads from memory, then the nodes it computes.
    assert by_kernel == {
        "0": ["x", "w", "bias", "mm", "bias_b", "y", "g"],
        "1": ["g", "m", "s", "e", "z", "o"],
        "2": ["o", "flip"],
    }
    assert [a["data-node"] for a in c.with_class("g", "read")] == ["x", "w", "bias", "g", "o"]


def test_edges_between_kernels_and_inside_them(graph: Graph, plan: FusionPlan) -> None:
    c = parse(build_report(graph, plan, "h100").to_html())
    between = [(a["data-from"], a["data-to"]) for a in c.with_class("g", "edge") if a["data-from"].isdigit()]
    assert between == [("0", "1"), ("1", "2")]  # %g and %o go through memory
    kinds = {
        (a["data-from"], a["data-to"]): cls
        for cls in ("fused", "dram", "input")
        for a in c.with_class("g", cls)
        if not a["data-from"].isdigit()
    }
    assert {e for e, k in kinds.items() if k == "dram"} == {("g", "m"), ("g", "s"), ("o", "flip")}
    assert {e for e, k in kinds.items() if k == "input"} == {("x", "mm"), ("w", "mm"), ("bias", "bias_b")}
    assert kinds[("mm", "y")] == kinds[("e", "z")] == "fused"
    assert len(kinds) == sum(len(set(n.inputs)) for n in graph.nodes) == 14


def test_data_block_carries_kernels_nodes_and_decisions(graph: Graph, plan: FusionPlan) -> None:
    c = parse(build_report(graph, plan, "h100").to_html())
    data = json.loads(c.scripts["report-data"])
    assert [d["rule"] for d in data["decisions"]] == [d.rule for d in plan.decisions]
    assert data["decisions"][3]["accepted"] is False
    assert data["nodes"]["flip"]["op"] == "opaque:flip" and data["nodes"]["e"]["kernels"] == [1]
    k1 = data["kernels"][1]
    assert (k1["name"], k1["nodes"], k1["pattern"], k1["segment"]) == (
        "k1",
        ["m", "s", "e", "z", "o"],
        "softmax row kernel",
        "vf_seg0",
    )
    assert k1["measured"] is None and "not profiled" in data["notProfiled"]
    assert data["layout"] in ("dot", "fallback")
    rows = [a for t, a in c.tags if t == "tr" and "data-decision" in a]
    assert [a["data-decision"] for a in rows] == [str(i) for i in range(len(plan.decisions))]
    assert [a["data-verdict"] for a in rows].count("rejected") == 2
    rules = [a["value"] for t, a in c.tags if t == "option" and a.get("value")]
    assert "elementwise-into-any" in rules and "opaque-alone" in rules  # the rule filter's choices


def test_text_from_the_plan_is_escaped(graph: Graph, plan: FusionPlan) -> None:
    evil = Decision(("o",), ("flip",), False, Rule.OPAQUE_ALONE, "ends </script><b>here</b>", None)
    hostile = FusionPlan(graph, "h100", plan.groups, (*plan.decisions, evil))
    page = build_report(graph, hostile, "h100").to_html()
    c = parse(page)
    plain = parse(build_report(graph, plan, "h100").to_html())
    assert [t for t, _ in c.tags].count("b") == [t for t, _ in plain.tags].count("b")  # no injected tag
    assert "ends &lt;/script&gt;&lt;b&gt;here&lt;/b&gt;" in page  # the decision table shows it as text
    assert json.loads(c.scripts["report-data"])["decisions"][-1]["reason"] == "ends </script><b>here</b>"


def no_overlaps(boxes: list[Box]) -> bool:
    return not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def ladder(n: int) -> Spec:
    """A chain with residual edges skipping two boxes, and a side branch every third box."""
    sizes = {f"k{i}": (280.0, 56.0) for i in range(n)}
    edges = [(f"k{i}", f"k{i + 1}") for i in range(n - 1)]
    edges += [(f"k{i}", f"k{i + 3}") for i in range(0, n - 3, 3)]
    return Spec(sizes, tuple(edges))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_graphviz_lays_out_without_overlaps() -> None:
    (lay,) = layout_all([ladder(40)])
    assert lay.engine == "dot"
    assert no_overlaps(list(lay.boxes.values()))
    # Edges run downwards from the tail's bottom to the head's top (rankdir TB).
    for (a, b), d in lay.paths.items():
        start = [float(v) for v in d[1:].split(" ")[0].split(",")]
        assert lay.boxes[a].y + lay.boxes[a].h - 1 <= start[1] < lay.boxes[b].y
    assert all(0 <= bx.x and bx.x + bx.w <= lay.width and bx.y + bx.h <= lay.height for bx in lay.boxes.values())


def test_without_graphviz_the_page_says_so(graph: Graph, plan: FusionPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout.shutil, "which", lambda name: None)
    (lay,) = layout_all([ladder(12)])
    assert lay.engine == "fallback" and no_overlaps(list(lay.boxes.values()))
    page = build_report(graph, plan, "h100").to_html()
    assert "Graphviz <code>dot</code> was not found" in page
    assert json.loads(parse(page).scripts["report-data"])["layout"] == "fallback"


def test_recomputed_node_is_in_each_kernel_that_computes_it(recompute: tuple[Graph, FusionPlan]) -> None:
    c = parse(build_report(*recompute, "cpu").to_html())
    homes = [a["data-kernel"] for a in c.with_class("g", "node") if a["data-node"] == "n"]
    assert homes == ["0", "1"]
    assert {a["data-to"] for a in c.with_class("g", "fused")} == {"a", "s"}
    assert json.loads(c.scripts["report-data"])["nodes"]["n"]["kernels"] == [0, 1]


def test_plan_without_kernels_still_renders(graph: Graph) -> None:
    c = parse(build_report(graph, FusionPlan(graph, "cpu", (), ()), "cpu").to_html())
    assert c.with_class("g", "kernel") == [] and c.with_class("g", "node") == []
