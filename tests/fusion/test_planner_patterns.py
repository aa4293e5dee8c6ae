"""The seed's fusion patterns, decomposed as the frontend lowers them, plan to one kernel each."""

from __future__ import annotations

import pytest
from tests.fusion.fusion_patterns import (
    FIXED_CPU,
    SINGLE_KERNEL_PATTERNS,
    attention_written_out,
    check_plan,
    labels,
    layer_norm,
)

from vfuse.fusion import format_plan, lower_bound_bytes, plan_fusion
from vfuse.targets import get_target

EXPECTED_LABEL = {
    "elementwise_chain": "pointwise",
    "layer_norm": "row",
    "rms_norm_silu": "row",
    "linear_gelu": "gemm",
    "conv_bn_relu": "conv",
    "attention_sdpa": "attention",
    "gelu_dropout_residual": "pointwise",
    "dequant_op_quant": "pointwise",
}
TARGETS = [FIXED_CPU, get_target("h100"), get_target("a100")]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("name", sorted(SINGLE_KERNEL_PATTERNS))
def test_seed_pattern_is_one_kernel(name: str, target: object) -> None:
    graph = SINGLE_KERNEL_PATTERNS[name]()
    plan = plan_fusion(graph, target)  # type: ignore[arg-type]
    check_plan(plan)
    assert labels(plan) == [EXPECTED_LABEL[name]]
    (kernel,) = plan.groups
    assert kernel.outputs == graph.outputs
    assert set(kernel.inputs) == {n.name for n in graph.inputs} | {n.name for n in graph if n.op.value == "rng_seed"}
    # Every value between the ops stays on chip: traffic is (almost) the unavoidable minimum.
    assert kernel.cost.bytes <= 1.15 * lower_bound_bytes(graph)
    merges = sum(d.accepted for d in plan.decisions)
    assert merges >= len(kernel.nodes) - 1  # one accepted decision per merge (recompute: one per copy)


def test_layer_norm_plan_text() -> None:
    text = format_plan(plan_fusion(layer_norm(), FIXED_CPU))
    lines = text.splitlines()
    assert lines[0].startswith("plan for cpu-fixed: 1 kernels from 14 nodes")
    assert lines[1].startswith("kernel 0 row: %sum, %inv_d, %mean, %xc, %sq, %sum2,")
    assert lines[1].endswith("<- (%in0, %in1, %in2) -> (%out)")
    assert "memory-bound" in lines[2]
    # the centred value feeds the variance and the output: recomputed, or merged once the
    # variance chain has joined (the cycle rejection is logged on the way)
    assert any(d.accepted and d.rule == "multi-pass-row" for d in plan_fusion(layer_norm(), FIXED_CPU).decisions)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_written_out_attention_is_three_kernels(target: object) -> None:
    """Without the attention rewrite (a later pass), softmax between two matmuls cannot join
    either: a contraction kernel takes only a pointwise epilogue. On the CPU the scale joins
    QK^T as its epilogue; on GPUs it is recomputed inside the row kernel instead (same count,
    other split). The log says why the softmax stays apart."""
    plan = plan_fusion(attention_written_out(), target)  # type: ignore[arg-type]
    check_plan(plan)
    assert labels(plan) == ["gemm", "row", "gemm"]
    first, row, last = (set(g.nodes) for g in plan.groups)
    assert {"amax", "shifted", "exp", "sum"} <= row and "qk" in first and "pv" in last
    if target is FIXED_CPU:
        assert (first, row, last) == ({"qk", "scale", "scores"}, {"amax", "shifted", "exp", "sum", "probs"}, {"pv"})
    blocked = {d.rule for d in plan.decisions if not d.accepted}
    assert "contraction-with-reduction" in blocked
    # the scores matrix is written and read back: 5x the unavoidable traffic at this size
    total = sum(g.cost.bytes for g in plan.groups)
    assert total > 3 * lower_bound_bytes(plan.graph)
