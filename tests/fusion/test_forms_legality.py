"""Kernel forms and legality rules on hand-picked node sets."""

from __future__ import annotations

import pytest
from tests.fusion.fusion_patterns import FIXED_CPU, _input, layer_norm, linear_gelu

from vfuse.fusion import Budgets
from vfuse.fusion.cost import default_outputs
from vfuse.fusion.forms import Form, Illegal, classify
from vfuse.fusion.legality import check_kernel
from vfuse.ir import Graph, GraphBuilder, Op, verify


def _classify(g: Graph, names: list[str]) -> Form | Illegal:
    nodes = [g[n] for n in names]
    return classify(nodes, default_outputs(nodes, g), g)


def _rule(result: Form | Illegal) -> str:
    assert isinstance(result, Illegal), result
    return result.rule


def test_layer_norm_is_a_row_kernel_with_two_spaces() -> None:
    g = layer_norm(rows=8, d=32)
    form = _classify(g, [n.name for n in g.compute_nodes])
    assert isinstance(form, Form)
    assert (form.label, form.domain, form.rows) == ("row", 8 * 32, 8)
    assert form.space["rstd"] == 8 and form.space["xc"] == 8 * 32 and form.space["eps"] == 8 * 32


def test_gemm_epilogue_and_its_space() -> None:
    g = linear_gelu(m=16, k=8, n=32)
    form = _classify(g, ["mm", "bias_add", "gelu"])
    assert isinstance(form, Form) and form.label == "gemm" and form.domain == 16 * 32


def _mixed() -> Graph:
    b = GraphBuilder()
    x, w = _input(b, 0, (64, 64)), _input(b, 1, (64, 64))
    e = b.add(Op.EXP, (x,), name="exp")
    m = b.add(Op.MATMUL, (e, w), name="mm")
    s = b.add(Op.SUM, (m,), name="sum", axes=(1,), keepdim=True)
    m2 = b.add(Op.MATMUL, (m, w), name="mm2")
    sl = b.add(Op.SLICE, (m,), name="slice", dim=0, start=0, end=8, step=1)
    t = b.add(Op.SUM, (x,), name="sum_rows", axes=(0,), keepdim=True)
    return verify(b.build([s, m2, sl, t, e]))


@pytest.mark.parametrize(
    ("names", "rule"),
    [
        (["mm", "mm2"], "two-contractions"),
        (["mm", "sum"], "contraction-with-reduction"),
        (["exp", "mm"], "prologue-too-expensive"),
        (["mm", "slice"], "view-not-expressible"),
        (["sum", "sum_rows"], "reduce-axes-differ"),
    ],
)
def test_forbidding_rules(names: list[str], rule: str) -> None:
    assert _rule(_classify(_mixed(), names)) == rule


def test_pointwise_outputs_must_share_a_size() -> None:
    b = GraphBuilder()
    x, v = _input(b, 0, (64, 64)), _input(b, 1, (64,))
    small = b.add(Op.NEG, (v,), name="small")
    big = b.add(Op.ADD, (x, small), name="big")
    g = verify(b.build([small, big]))
    assert _rule(_classify(g, ["small", "big"])) == "pointwise-outputs-differ"
    assert isinstance(_classify(g, ["big"]), Form)


def test_kernel_size_cap_is_a_budget() -> None:
    g = layer_norm(rows=8, d=32)
    nodes = list(g.compute_nodes)
    assert isinstance(check_kernel(nodes, default_outputs(nodes, g), g, FIXED_CPU, Budgets()), Form)
    capped = check_kernel(nodes, default_outputs(nodes, g), g, FIXED_CPU, Budgets(max_nodes=5))
    assert _rule(capped) == "kernel-size-cap"
