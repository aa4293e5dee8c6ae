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


def test_a_permuted_gemm_output_is_not_its_epilogue() -> None:
    """The templates store in the contraction's order: a permute of the output (qkv split into
    heads) is another kernel's, where it was split off after the plan and stored twice; a
    transpose of a transpose (a weight gradient) reads in order and stays fused."""
    b = GraphBuilder()
    x, w = _input(b, 0, (12, 8)), _input(b, 1, (8, 30))
    m = b.add(Op.MATMUL, (x, w), name="mm")
    r = b.add(Op.RESHAPE, (m,), name="heads", shape=(3, 4, 3, 10))
    p = b.add(Op.PERMUTE, (r,), name="perm", perm=(2, 0, 1, 3))
    t1 = b.add(Op.PERMUTE, (m,), name="t1", perm=(1, 0))
    t2 = b.add(Op.PERMUTE, (t1,), name="t2", perm=(1, 0))
    g = verify(b.build([p, t2]))
    assert _rule(_classify(g, ["mm", "heads", "perm"])) == "epilogue-space-mismatch"
    assert isinstance(_classify(g, ["mm", "heads"]), Form)
    assert isinstance(_classify(g, ["mm", "t1", "t2"]), Form)


def _gelu_operand(m: int, on_b: bool, batch: tuple[int, ...] = (), b_batch: tuple[int, ...] = ()) -> Graph:
    b = GraphBuilder()
    ops = [_input(b, 0, (*batch, m, 48)), _input(b, 1, (*b_batch, 48, 40))]
    side = 1 if on_b else 0
    ops[side] = b.add(Op.GELU, (ops[side],), name="gelu", approximate="none")
    return verify(b.build([b.add(Op.MATMUL, tuple(ops), name="mm")]))


@pytest.mark.parametrize(
    ("m", "on_b", "batch", "b_batch", "legal"),
    [
        (256, True, (), (), True),  # B packed once: GELU's 14 flops against 2 * 256 per B element
        (97, True, (), (), False),  # too few rows to pay for it (14 > 2 * 97 / 16)
        (256, False, (), (), False),  # A is packed once per column panel: the 4-flop cap stays
        (256, True, (3,), (3,), True),
        (256, True, (3,), (), False),  # B broadcast over the batch: packed (recomputed) 3 times
    ],
)
def test_dear_prologue_on_a_matmuls_b_only(m: int, on_b: bool, batch: tuple, b_batch: tuple, legal: bool) -> None:
    g = _gelu_operand(m, on_b, batch, b_batch)
    result = _classify(g, ["gelu", "mm"])
    assert isinstance(result, Form) if legal else _rule(result) == "prologue-too-expensive"
