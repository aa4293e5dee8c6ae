"""What the planner must not fuse, and that the decision log says why."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import lower_fn
from tests.fusion.fusion_patterns import F32, FIXED_CPU, _input, _scalar, check_plan, labels, layer_norm, rules

from vfuse.fusion import Budgets, plan_fusion
from vfuse.ir import DType, GraphBuilder, Op, verify
from vfuse.targets import get_target


def _holders(plan: object, node: str) -> int:
    return sum(node in g.nodes for g in plan.groups)  # type: ignore[attr-defined]


def test_expensive_producer_with_two_consumers_is_not_duplicated() -> None:
    b = GraphBuilder()
    x = _input(b, 0, (512, 512))
    e = b.add(Op.EXP, (b.add(Op.TANH, (x,), name="tanh"),), name="exp")  # 18 flops/element
    s = b.add(Op.SUM, (e,), name="rowsum", axes=(1,), keepdim=True)
    m = b.add(Op.MATMUL, (e, _input(b, 1, (512, 512))), name="mm")
    plan = plan_fusion(verify(b.build([s, m])), FIXED_CPU)
    check_plan(plan)
    assert _holders(plan, "exp") == 1 and _holders(plan, "tanh") == 1
    why = [d for d in plan.decisions if d.rule == "recompute-too-expensive" and "exp" in d.producer]
    assert why and "flops/element" in why[0].reason


def test_cheap_producer_with_two_consumers_is_recomputed_in_each() -> None:
    b = GraphBuilder()
    x = _input(b, 0, (512, 512))
    a = b.add(Op.ADD, (x, _scalar(b, 1.0)), name="shift")  # 1 flop/element
    s = b.add(Op.SUM, (a,), name="rowsum", axes=(1,), keepdim=True)
    m = b.add(Op.MATMUL, (a, _input(b, 1, (512, 512))), name="mm")
    plan = plan_fusion(verify(b.build([s, m])), FIXED_CPU)
    check_plan(plan)
    assert sorted(labels(plan)) == ["gemm", "row"]
    assert _holders(plan, "shift") == 2  # computed in both kernels, never written
    assert all("shift" not in g.outputs for g in plan.groups)
    assert "recompute-into-consumers" in rules(plan, accepted=True)


def test_reductions_over_different_axes_are_not_merged() -> None:
    b = GraphBuilder()
    x = _input(b, 0, (512, 768))
    s1 = b.add(Op.SUM, (x,), name="over_cols", axes=(1,), keepdim=True)
    y = b.add(Op.SUB, (x, s1), name="centred")
    s2 = b.add(Op.SUM, (y,), name="over_rows", axes=(0,), keepdim=True)
    out = b.add(Op.MUL, (y, s2), name="out")
    plan = plan_fusion(verify(b.build([out])), FIXED_CPU)
    check_plan(plan)
    assert len(plan.groups) >= 2
    assert plan.group_of("over_cols") is not plan.group_of("over_rows")
    assert "reduce-axes-differ" in rules(plan, accepted=False)


def test_reductions_over_different_shapes_are_not_merged() -> None:
    b = GraphBuilder()
    x = _input(b, 0, (512, 768))
    s = b.add(Op.SUM, (x,), name="rows", axes=(1,), keepdim=False)  # (512,)
    total = b.add(Op.SUM, (b.add(Op.MUL, (s, s), name="sq"),), name="total", axes=(0,), keepdim=False)
    plan = plan_fusion(verify(b.build([total])), FIXED_CPU)
    check_plan(plan)
    assert sorted(labels(plan)) == ["reduction", "row"]  # sq joins one of them
    assert plan.group_of("rows") is not plan.group_of("total")
    assert "reduce-shapes-differ" in rules(plan, accepted=False)


def _two_way_sum(width: int) -> tuple[GraphBuilder, str]:
    """width f64 values y_i = exp(x_i) (two registers each), summed once in order and once in
    reverse order: every y_i stays live until both sums have read it (exp is too costly to
    recompute), so registers per point grow with width while the work per value is constant."""
    b = GraphBuilder()
    ys = [b.add(Op.EXP, (_input(b, i, (1 << 20,), DType.F64),), name=f"y{i}") for i in range(width)]
    fwd, bwd = ys[0], ys[-1]
    for i in range(1, width):
        fwd = b.add(Op.ADD, (fwd, ys[i]), name=f"f{i}")
        bwd = b.add(Op.ADD, (bwd, ys[width - 1 - i]), name=f"b{i}")
    return b, b.add(Op.MUL, (fwd, bwd), name="out")


def test_register_budget_splits_a_wide_kernel_on_gpu() -> None:
    b, out = _two_way_sum(72)
    h100 = get_target("h100")
    plan = plan_fusion(verify(b.build([out])), h100)
    check_plan(plan)
    assert len(plan.groups) > 1
    why = [d for d in plan.decisions if d.rule == "register-budget"]
    assert why and "registers per thread" in why[0].reason
    assert all(g.cost.pressure <= 1.0 for g in plan.groups)
    # a narrow one of the same kind fits the budget and stays one kernel
    b2, out2 = _two_way_sum(8)
    assert len(plan_fusion(verify(b2.build([out2])), h100).groups) == 1


def test_two_contractions_stay_apart() -> None:
    b = GraphBuilder()
    x, w1, w2 = _input(b, 0, (256, 256)), _input(b, 1, (256, 256)), _input(b, 2, (256, 256))
    h = b.add(Op.RELU, (b.add(Op.MATMUL, (x, w1), name="mm1"),), name="relu")
    out = b.add(Op.MATMUL, (h, w2), name="mm2")
    plan = plan_fusion(verify(b.build([out])), FIXED_CPU)
    check_plan(plan)
    assert [set(g.nodes) for g in plan.groups] == [{"mm1", "relu"}, {"mm2"}]
    assert "two-contractions" in rules(plan, accepted=False)


def test_merge_that_would_create_a_cycle_is_refused() -> None:
    """mm -> mm2 -> add and mm -> add: mm joining add's kernel would put mm2 both before
    and after it."""
    b = GraphBuilder()
    x, w = _input(b, 0, (256, 256)), _input(b, 1, (256, 256))
    mm = b.add(Op.MATMUL, (x, w), name="mm")
    mm2 = b.add(Op.MATMUL, (b.add(Op.EXP, (mm,), name="exp"), w), name="mm2")
    out = b.add(Op.ADD, (mm, mm2), name="add")
    plan = plan_fusion(verify(b.build([out])), FIXED_CPU)
    check_plan(plan)
    assert plan.group_of("mm") is not plan.group_of("add")
    refused = {d.rule for d in plan.decisions if not d.accepted and "mm" in d.producer and "add" in d.consumer}
    assert refused & {"would-create-cycle", "two-contractions"}


def test_kernel_size_cap_splits_a_chain() -> None:
    b = GraphBuilder()
    v = _input(b, 0, (4096,))
    for i in range(10):
        v = b.add(Op.RELU if i % 2 else Op.NEG, (v,), name=f"op{i}")
    plan = plan_fusion(verify(b.build([v])), FIXED_CPU, Budgets(max_nodes=4))
    check_plan(plan)
    assert [len(g.nodes) for g in plan.groups] == [4, 4, 2]
    assert "kernel-size-cap" in rules(plan, accepted=False)
    assert F32  # the patterns' dtype is the one used here


def test_row_too_wide_for_the_cache_is_split_on_cpu() -> None:
    """LayerNorm over 2^18-wide rows: keeping x and the centred row on chip for the later passes
    needs 2 MiB per core, above the 1 MiB L2, so the row kernel is split."""
    plan = plan_fusion(layer_norm(rows=2, d=1 << 18), FIXED_CPU)
    check_plan(plan)
    assert len(plan.groups) > 1
    assert "cache-budget" in rules(plan, accepted=False)
    assert len(plan_fusion(layer_norm(rows=2, d=1 << 12), FIXED_CPU).groups) == 1


def test_a_value_kept_on_chip_is_counted_once() -> None:
    """The frontend's LayerNorm (corrected two-pass statistics) keeps only x on chip across its
    passes: 192K-wide rows need 768 KiB of the 1 MiB L2 and stay one kernel, whichever merges
    the planner takes first (the working set counted x again at each merge that read it and split
    this row kernel: 1.5 MiB > 1 MiB)."""
    graph = lower_fn(lambda x: F.layer_norm(x, (x.shape[-1],)), [torch.randn(2, 3 << 16)])
    plan = plan_fusion(graph, FIXED_CPU)
    check_plan(plan)
    assert len(plan.groups) == 1 and "cache-budget" not in rules(plan, accepted=False)
