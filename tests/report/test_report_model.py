"""build_report on a hand-built graph and plan: every figure checked against a hand count, and the
kernels that run read off the schedule (a group split into several kernels, the reference executor)."""

from __future__ import annotations

import json

import pytest

from vfuse.fusion.plan import Cost, FusionPlan
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType
from vfuse.report import RunKind, build_report
from vfuse.report.rows import BASELINE

F = 64 * 256 * 4  # one f32[64,256] activation
W = 256 * 256 * 4  # the f32[256,256] weight
BIAS = 256 * 4
ROW = 64 * 4  # one f32[64,1] row statistic


def test_counts_and_totals(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert r.target == "h100"
    # GEMM template + softmax row kernel in one native call; the flip through torch.
    assert (r.num_kernels, r.native_calls, r.torch_calls, r.num_groups) == (2, 1, 1, 3)
    assert [k.runs for k in r.kernels] == [RunKind.TEMPLATE, RunKind.NATIVE, RunKind.TORCH]
    assert r.num_ops == 10
    # Each group runs as one kernel, so each keeps the planner's own cost.
    assert r.bytes_fused == sum(k.bytes for k in r.kernels) == sum(g.cost.bytes for g in plan.groups)
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


def test_kernel_rows_read_the_program(graph: Graph, plan: FusionPlan) -> None:
    k0, k1, k2 = build_report(graph, plan, "h100").kernels
    assert (k0.id, k0.name, k0.group, k0.segment, k0.label, k0.kind, k0.bound) == (
        0,
        "k0_c",
        0,
        "vf_seg0",
        "gemm",
        "contraction",
        "compute",
    )
    assert k0.nodes == ("mm", "bias_b", "y", "g")
    assert k0.ops == ("matmul", "expand", "add", "gelu")
    assert (k0.inputs, k0.outputs) == (("x", "w", "bias"), ("g",))
    assert k0.pattern == "matmul+add+GELU GEMM epilogue"  # no module table: the bias add is named
    assert (k1.name, k1.label, k1.bound, set(k1.outputs), k1.inputs) == ("k1", "row", "memory", {"m", "o"}, ("g",))
    assert k1.ops == ("amax", "sub", "exp", "sum", "div")
    assert k1.pattern == "softmax row kernel"
    assert (k2.name, k2.segment, k2.ops, k2.time_s, k2.pattern) == ("torch2", "", ("opaque:flip",), 4e-6, "torch: flip")
    assert k2.note == "opaque op" and k2.measured_s is None


def test_kernel_of(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert r.kernel_of("e") is r.kernels[1]
    assert r.kernel_of("x") is None


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
    assert [k.id for k in r.kernels_of("n")] == [0, 1]
    assert r.recomputed == {"n": (0, 1)}
    assert r.num_ops == 3  # the IR op counts once, however many kernels compute it
    assert (r.edge_kind("n", "a"), r.edge_kind("n", "s"), r.edge_kind("x", "n")) == ("fused", "fused", "input")
    assert r.shared_kernel("n", "s") is r.kernels[1]


def test_edge_between_kernels_is_dram(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100")
    assert (r.edge_kind("g", "m"), r.edge_kind("y", "g"), r.shared_kernel("g", "m")) == ("dram", "fused", None)


def test_a_group_split_by_code_generation_shows_every_kernel(two_shapes: tuple[Graph, FusionPlan]) -> None:
    graph, plan = two_shapes
    r = build_report(graph, plan, "h100")
    assert [(k.name, k.group, k.nodes, k.outputs) for k in r.kernels] == [
        ("k0", 0, ("a",), ("a",)),
        ("k0_1", 0, ("c",), ("c",)),
    ]
    assert (r.num_groups, r.num_kernels, r.native_calls, r.split_groups) == (1, 2, 1, {0: (0, 1)})
    # Split kernels are priced on their own nodes by the cost model, not given the group's figure.
    assert all(k.time_s is not None and k.time_s < 9.0 for k in r.kernels)
    assert r.kernels[0].bytes == 2 * 8 * 16 * 4 and r.kernels[1].bytes == 2 * 16 * 4
    assert "2 ops -> 1 planner group; code generation runs 1 of them as several kernels" in r.to_text()


def test_reference_executor_runs_every_op_through_torch(graph: Graph, plan: FusionPlan) -> None:
    r = build_report(graph, plan, "h100", note="backend='interp'")
    assert (r.backend, r.num_kernels, r.native_calls, r.torch_calls) == ("interp", 0, 0, 10)
    assert all(k.runs is RunKind.TORCH and len(k.nodes) == 1 for k in r.kernels)
    assert "10 torch calls (backend='interp')" in r.to_text()


def test_json_holds_every_figure(graph: Graph, plan: FusionPlan) -> None:
    unfused = {n.name: _cost(1e-6) for n in graph.compute_nodes}
    data = json.loads(json.dumps(build_report(graph, plan, "h100", unfused).to_json()))
    assert data["runs"] == {"kernels": 2, "native_calls": 1, "torch_calls": 1}
    assert data["time"]["baseline"] == BASELINE == "vs unfused (cost model)"
    assert data["time"]["speedup"] == pytest.approx(10e-6 / 15e-6)
    assert [k["name"] for k in data["kernels"]] == ["k0_c", "k1", "torch2"]
    assert data["kernels"][2] | {"nodes": ["flip"], "runs": "torch"} == data["kernels"][2]
    assert [d["rule"] for d in data["decisions"]] == [d.rule.value for d in plan.decisions]
    assert data["bytes"]["lower_bound"] == F + W + BIAS + F + ROW
