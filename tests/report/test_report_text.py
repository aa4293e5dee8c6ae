"""str(report): the summary, one row per kernel, the decision log; plain text, no escape codes."""

from __future__ import annotations

import re

from vfuse.fusion.plan import FusionPlan, Group
from vfuse.ir import Graph, Kind
from vfuse.report import build_report
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time


def test_summary_lines(graph: Graph, plan: FusionPlan) -> None:
    text = str(build_report(graph, plan, "h100"))
    assert "vfuse fusion report (target: h100)" in text
    assert "10 ops -> 3 kernels" in text
    assert "unfused 1.38 MiB -> fused 641 KiB (2.20x less); lower bound 385 KiB" in text
    assert "unfused n/a -> fused 15 µs" in text
    assert "6 accepted, 2 rejected" in text
    assert "flip x1" in text


def test_one_row_per_kernel(graph: Graph, plan: FusionPlan) -> None:
    text = str(build_report(graph, plan, "h100"))
    # One line per kernel, then its further inputs / outputs one per line below.
    expected = [
        r"0\s+gemm\s+matmul > expand > add > gelu\s+8 µs\s+385 KiB\s+compute\s+%x\s+%g\n\s+%w\n\s+%bias\n",
        r"1\s+row\s+amax > sub > exp > sum > div\s+3 µs\s+128 KiB\s+memory\s+%g\s+%m\n\s+%o\n",
        r"2\s+opaque\s+opaque:flip\s+4 µs\s+128 KiB\s+memory\s+%o\s+%flip\n",
    ]
    for row in expected:
        assert len(re.findall(rf"^\s*{row}", text, re.MULTILINE)) == 1, row


def test_long_value_lists_are_cut(graph: Graph, plan: FusionPlan) -> None:
    many = [
        Group(
            0, plan.groups[0].nodes, Kind.CONTRACTION, "gemm", ("x", "w", "bias", "g", "m"), ("y",), plan.groups[0].cost
        )
    ]
    text = str(build_report(graph, FusionPlan(graph, "h100", tuple(many), ()), "h100"))
    assert re.search(r"%x\s+%y\n\s+%w\n\s+%bias\n\s+\+2 more\n", text)


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
    assert "recomputed        %n in kernels 0, 1\n" in text
    assert "3 ops -> 2 kernels" in text
