"""str(report): the summary, one row per kernel that runs, the decision log; plain text, no escape codes.
`to_text(summary=True)`: the summary, one line per kernel, decisions counted by rule."""

from __future__ import annotations

import re

from vfuse.fusion.plan import Cost, FusionPlan
from vfuse.ir import Graph
from vfuse.report import build_report
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time


def test_summary_lines(graph: Graph, plan: FusionPlan) -> None:
    text = str(build_report(graph, plan, "h100"))
    assert "vfuse fusion report (target: h100)" in text
    assert "runs              2 native kernels in 1 native call, 1 torch call\n" in text
    assert "planned           10 ops -> 3 planner groups\n" in text
    assert "unfused 1.38 MiB -> fused 641 KiB (2.20x less); lower bound 385 KiB" in text
    assert "unfused n/a -> fused 15 µs\n" in text
    assert "6 accepted, 2 rejected" in text
    assert "flip x1" in text


def test_one_row_per_kernel(graph: Graph, plan: FusionPlan) -> None:
    text = str(build_report(graph, plan, "h100"))
    # Name, pattern and figures on the first line; how it runs and the op chain's rest below.
    expected = [
        r"0\s+k0_c\s+matmul\+add\+GELU GEMM epilogue\s+matmul > expand > add > gelu\s+8 µs\s+385 KiB\s+compute\n"
        r"\s+template\n",
        r"1\s+k1\s+softmax row kernel\s+amax > sub > exp > sum > div\s+3 µs\s+128 KiB\s+memory\n\s+native\n",
        r"2\s+torch2\s+torch: flip\s+opaque:flip\s+4 µs\s+128 KiB\s+memory\n",
    ]
    for row in expected:
        assert len(re.findall(rf"^\s*{row}", text, re.MULTILINE)) == 1, row


def test_predicted_speedup_names_its_baseline(graph: Graph, plan: FusionPlan) -> None:
    unfused = {n.name: Cost(0, 0, 0.0, 0.0, 0.0, 3e-6, 0.0, 1.0) for n in graph.compute_nodes}
    text = str(build_report(graph, plan, "h100", unfused))
    assert "unfused 30 µs -> fused 15 µs (2.00x faster vs unfused (cost model))" in text


def test_summary_is_short(graph: Graph, plan: FusionPlan) -> None:
    text = build_report(graph, plan, "h100").to_text(summary=True)
    assert "runs              2 native kernels" in text
    assert re.search(r"^\s+2\s+torch2\s+torch: flip\s+4 µs", text, re.MULTILINE)
    assert "amax > sub" not in text and "GEMM tile does not own full rows" not in text  # no ops, no decision log
    # Decisions counted by rule, most frequent first.
    assert re.search(r"elementwise-into-any\s+2\s+0\n", text)
    assert re.search(r"opaque-alone\s+0\s+1\n", text)
    assert len(text.splitlines()) < len(str(build_report(graph, plan, "h100")).splitlines())


def test_decision_log(graph: Graph, plan: FusionPlan) -> None:
    text = str(build_report(graph, plan, "h100"))
    for d in plan.decisions:
        assert d.rule in text
    assert re.search(r"3\s+rejected\s+%g\s+-\s+contraction-with-reduction\n\s+-> %m\s+GEMM tile", text)
    assert "GEMM tile does not own full rows" in text


def test_plain_and_within_width(graph: Graph, plan: FusionPlan) -> None:
    text = build_report(graph, plan, "h100").to_text(width=100)
    assert "\x1b" not in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert all(line == line.rstrip() for line in text.splitlines())


def test_no_decisions_says_so(graph: Graph) -> None:
    assert "decisions: none logged" in str(build_report(graph, FusionPlan(graph, "cpu", (), ()), "cpu"))


def test_units() -> None:
    assert [fmt_bytes(n) for n in (0, 1023, 1536, 3 * 2**20, 5 * 2**30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "3 MiB",
        "5 GiB",
    ]
    assert [fmt_time(t) for t in (None, 2.0, 1.5e-3, 15e-6, 3e-9)] == ["n/a", "2 s", "1.5 ms", "15 µs", "3 ns"]
    assert (fmt_ratio(3.0, 1.5), fmt_ratio(None, 1.0), fmt_ratio(1.0, 0.0)) == ("2.00x", "", "")
    assert fmt_names(["a", "b", "c"], 2) == "%a, %b +1 more"
    assert fmt_names(["a"]) == "%a"


def test_recomputation_is_listed(recompute: tuple[Graph, FusionPlan]) -> None:
    text = str(build_report(*recompute, "cpu"))
    assert "recomputed        %n in kernels #0, #1\n" in text
    assert "3 ops -> 2 planner groups" in text and "2 native kernels" in text
