"""build_report on a hand-built graph and plan: every figure checked against a hand count."""

from __future__ import annotations

import pytest

from vfuse.fusion.plan import Cost, FusionPlan
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType
from vfuse.report import build_report

F = 64 * 256 * 4  # one f32[64,256] activation
W = 256 * 256 * 4  # the f32[256,256] weight
BIAS = 256 * 4
ROW = 64 * 4  # one f32[64,1] row statistic


def test_counts_and_totals(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert r.target == "h100"
    assert r.num_kernels == len(r.groups) == 3
    assert r.num_ops == 10
    assert r.bytes_fused == sum(g.bytes for g in r.groups) == sum(g.cost.bytes for g in plan.groups)
    assert r.bytes_fused == (F + W + BIAS + F) + (2 * F + ROW) + 2 * F
    assert r.time_fused_s == pytest.approx(8e-6 + 3e-6 + 4e-6)
    assert r.fallbacks == {"flip": 1}
    assert r.decisions == plan.decisions
    assert (len(r.accepted), len(r.rejected)) == (6, 2)


def test_bytes_unfused_is_each_op_alone(graph: Graph, plan: FusionPlan) -> None:
    per_op = {
        "mm": F + W + F,
        "bias_b": BIAS + F,
        "y": 3 * F,
        "g": 2 * F,
        "m": F + ROW,
        "s": F + ROW + F,
        "e": 2 * F,
        "z": F + ROW,
        "o": F + ROW + F,
        "flip": 2 * F,
    }
    assert build_report(graph, plan, "h100").bytes_unfused == sum(per_op.values())


def test_lower_bound_reads_sources_once_and_writes_outputs_once(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert r.bytes_lower_bound == F + W + BIAS + F + ROW  # x, w, bias read; flip, m written
    assert r.bytes_lower_bound <= r.bytes_fused <= r.bytes_unfused


def test_lower_bound_agrees_with_cost_model(graph: Graph) -> None:
    from vfuse.fusion.cost import lower_bound_bytes

    assert build_report(graph, FusionPlan(graph, "cpu", (), ()), "cpu").bytes_lower_bound == lower_bound_bytes(graph)


def test_lower_bound_skips_unread_inputs_and_returned_inputs() -> None:
    b = GraphBuilder()
    t = TensorType((10,), DType.F32)
    x = b.add(Op.INPUT, name="x", index=0, type=t)
    b.add(Op.INPUT, name="unused", index=1, type=t)
    y = b.add(Op.NEG, [x], name="y")
    g = b.build([y, x])
    r = build_report(g, FusionPlan(g, "cpu", (), ()), "cpu")
    assert r.bytes_lower_bound == 40 + 40  # x read once, y written; unused never read, x returned as is


def test_kernel_rows_read_the_plan(graph: Graph, plan: FusionPlan) -> None:
    g0, g1, g2 = build_report(graph, plan, "h100").groups
    assert (g0.id, g0.label, g0.kind, g0.bound) == (0, "gemm", "contraction", "compute")
    assert g0.nodes == ("mm", "bias_b", "y", "g")
    assert g0.ops == ("matmul", "expand", "add", "gelu")
    assert (g0.inputs, g0.outputs) == (("x", "w", "bias"), ("g",))
    assert (g1.label, g1.bound, g1.outputs) == ("row", "memory", ("m", "o"))
    assert g1.ops == ("amax", "sub", "exp", "sum", "div")
    assert (g2.label, g2.ops, g2.time_s) == ("opaque", ("opaque",), 4e-6)


def test_group_of(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert r.group_of("e") is r.groups[1]
    assert r.group_of("x") is None


def _cost(time_s: float) -> Cost:
    return Cost(0, 0, 0.0, 0.0, 0.0, time_s, 0.0, 1.0)


def test_unfused_time_is_the_sum_of_single_op_costs(graph: Graph, plan: FusionPlan) -> None:
    unfused = {n.name: _cost(1e-6 * (i + 1)) for i, n in enumerate(graph.compute_nodes)}
    r = build_report(graph, plan, "h100", unfused)
    assert r.time_unfused_s == pytest.approx(1e-6 * sum(range(1, 11)))


def test_unfused_time_unknown_without_every_op(graph: Graph, plan: FusionPlan) -> None:
    assert build_report(graph, plan, "h100").time_unfused_s is None
    partial = {n.name: _cost(1e-6) for n in graph.compute_nodes[:-1]}
    assert build_report(graph, plan, "h100", partial).time_unfused_s is None


def test_repr_stays_short(graph: Graph, plan: FusionPlan) -> None:
    # The graph holds constant tensors; repr must not dump them.
    assert "tensor(" not in repr(build_report(graph, plan, "h100"))


def test_recomputed_node_belongs_to_every_kernel_that_computes_it(recompute: tuple[Graph, FusionPlan]) -> None:
    graph, plan = recompute
    r = build_report(graph, plan, "cpu")
    assert [g.id for g in r.groups_of("n")] == [0, 1]
    assert r.recomputed == {"n": (0, 1)}
    assert r.num_ops == 3  # the IR op counts once, however many kernels compute it
    assert (r.edge_kind("n", "a"), r.edge_kind("n", "s"), r.edge_kind("x", "n")) == ("fused", "fused", "input")
    assert r.shared_group("n", "s") is r.groups[1]


def test_edge_between_kernels_is_dram(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert (r.edge_kind("g", "m"), r.edge_kind("y", "g"), r.shared_group("g", "m")) == ("dram", "fused", None)
