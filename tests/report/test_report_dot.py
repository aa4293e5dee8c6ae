"""Graphviz output: one cluster per kernel that runs, holding exactly its nodes; sources outside; styled edges."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Graph
from vfuse.report import build_report
from vfuse.report.dot import quote


def clusters(dot: str) -> dict[str, list[str]]:
    """Cluster id -> names of the nodes declared inside it (the DOT we write has no nesting)."""
    out: dict[str, list[str]] = {}
    for cid, body in re.findall(r"subgraph cluster_(\d+) \{(.*?)\n  \}", dot, re.DOTALL):
        out[cid] = re.findall(r'^    "([^"]+)" \[label=', body, re.MULTILINE)
    return out


def test_one_cluster_per_kernel(graph: Graph, plan: FusionPlan) -> None:
    dot = build_report(graph, plan, "h100").to_dot()
    assert dot.startswith("digraph vfuse {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert clusters(dot) == {str(g.id): list(g.nodes) for g in plan.groups}  # each group runs as one kernel
    assert 'label="#0 k0_c: matmul+add+GELU GEMM epilogue\\n8 µs, 385 KiB, compute-bound"' in dot
    assert 'label="#2 torch2: torch: flip\\n4 µs, 128 KiB, memory-bound"' in dot


def test_every_node_declared_once_with_op_and_type(graph: Graph, plan: FusionPlan) -> None:
    dot = build_report(graph, plan, "h100").to_dot()
    for n in graph.nodes:
        assert len(re.findall(rf'^\s+"{n.name}" \[label=', dot, re.MULTILINE)) == 1
    assert '"mm" [label="%mm\\nmatmul : f32[64,256]"];' in dot
    assert '"x" [label="%x\\ninput : f32[64,256]", fillcolor="#eceff3"];' in dot


def test_edges(graph: Graph, plan: FusionPlan) -> None:
    dot = build_report(graph, plan, "h100").to_dot()
    edges = re.findall(r'^  "(\w+)" -> "(\w+)"(.*);$', dot, re.MULTILINE)
    assert len(edges) == 14
    dashed = {(a, b) for a, b, style in edges if "dashed" in style}
    assert dashed == {("g", "m"), ("g", "s"), ("o", "flip")}


def test_quote() -> None:
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_graphviz_accepts_it(graph: Graph, plan: FusionPlan) -> None:
    dot = build_report(graph, plan, "h100").to_dot()
    out = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.count('class="cluster"') == 3


def test_recomputed_node_gets_a_copy_per_extra_kernel(recompute: tuple[Graph, FusionPlan]) -> None:
    dot = build_report(*recompute, "cpu").to_dot()
    assert clusters(dot) == {"0": ["n", "a"], "1": ["n@k1", "s"]}
    assert '"n@k1" [label="%n\\nneg : f32[1024]\\n(recomputed)", style="rounded,filled,dashed"];' in dot
    edges = re.findall(r'^  "([\w@]+)" -> "([\w@]+)"(.*);$', dot, re.MULTILINE)
    assert [(a, b) for a, b, _ in edges] == [("x", "n"), ("x", "n@k1"), ("n", "a"), ("n@k1", "s")]
    assert [style for *_, style in edges][2:] == ["", ""]  # fused: plain edges


def test_a_split_group_is_one_cluster_per_kernel(two_shapes: tuple[Graph, FusionPlan]) -> None:
    dot = build_report(*two_shapes, "h100").to_dot()
    assert clusters(dot) == {"0": ["a"], "1": ["c"]}
    assert '"#1 k0_1: pointwise chain (neg)' in dot
