"""Transcendental ops chain only within one loop (`cost.chain_factor`, `cost.loop_levels`): a row
kernel's passes and a GEMM's prologue and epilogue run their own loops. Counting every transcendental
op of a kernel split tiny_graph's 10-pass tanh row kernel into 4-5 kernels on a calibrated target
(session 20, H5: predicted gains of a few ns)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.fusion.fusion_patterns import check_plan
from tests.targets.test_calibrate import BASE
from tests.targets.test_calibrate import CAL as CALIBRATION

from vfuse.fusion import estimate, plan_fusion
from vfuse.fusion import summary as sm
from vfuse.fusion.cost import chain_factor, loop_levels
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, verify
from vfuse.targets import calibrate as cal_mod
from vfuse.targets.calibrate import apply

F32 = DType.F32
# One thread of a Zen 4 at the avx2 tier (2026-12-03, `vfuse calibrate`, rounded): its op rates and chain weight.
CAL = dataclasses.replace(CALIBRATION, op_rates=(("exp", 27e9), ("tanh", 30e9), ("sigmoid", 34e9)), chain_weight=0.4)
TARGET = apply(BASE, CAL)


def tanh_rows(iterations: int = 10, n: int = 64) -> Graph:
    """tiny_graph's body: x = tanh(x * y + 0.5); x = x - mean(x), `iterations` times."""
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((n,), F32))
    y = b.add(Op.INPUT, name="y", index=1, type=TensorType((n,), F32))
    half = b.add(Op.FULL, name="half", value=0.5, shape=(), dtype=F32)
    inv = b.add(Op.FULL, name="inv", value=1 / n, shape=(), dtype=F32)
    for i in range(iterations):
        t = b.add(Op.TANH, (b.add(Op.ADD, (b.add(Op.MUL, (x, y), name=f"m{i}"), half), name=f"a{i}"),), name=f"t{i}")
        mean = b.add(Op.MUL, (b.add(Op.SUM, (t,), name=f"sum{i}", axes=(0,), keepdim=True), inv), name=f"mean{i}")
        x = b.add(Op.SUB, (t, mean), name=f"s{i}")
    return verify(b.build([x]))


def test_chains_count_per_loop() -> None:
    assert chain_factor((), TARGET) == chain_factor((1, 1, 1), TARGET) == 1.0
    assert chain_factor((3,), TARGET) == pytest.approx(1.8)  # one loop: two ops past the first
    assert chain_factor((3, 1), TARGET) == pytest.approx((3 * 1.8 + 1) / 4)  # weighed by their ops
    graph = tanh_rows(3)
    levels = loop_levels(graph.compute_nodes, graph)
    assert [levels[f"t{i}"] for i in range(3)] == [0, 1, 2]  # each tanh after the previous mean
    assert levels["s2"] == 3


def test_multi_pass_tanh_row_kernel_stays_one_kernel_calibrated() -> None:
    graph = tanh_rows()
    plan = plan_fusion(graph, TARGET)
    check_plan(plan)
    assert len(plan.groups) == 1, [g.nodes for g in plan.groups]
    exact = estimate(plan.groups[0].nodes, graph, TARGET)
    assert plan.groups[0].cost.time_s == pytest.approx(exact.time_s, 1e-3)  # the summaries price it the same
    assert exact.compute_s == pytest.approx(sum(estimate([f"t{i}"], graph, TARGET).compute_s for i in range(10)), 0.5)


def test_a_pointwise_chain_still_pays_its_chain() -> None:
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((300, 257), F32))
    e = b.add(Op.EXP, (x,), name="e")
    t = b.add(Op.TANH, (b.add(Op.NEG, (e,), name="n"),), name="t")
    graph = b.build([b.add(Op.SIGMOID, (t,), name="s")])
    merged = estimate(["e", "n", "t", "s"], graph, TARGET)
    alone = sum(estimate([v], graph, TARGET).compute_s for v in ("e", "n", "t", "s"))
    assert merged.compute_s == pytest.approx(alone * 1.8)  # three transcendental ops in one loop
    facts = {v.name: sm.node_facts(v, graph, TARGET) for v in graph.nodes}
    s = sm.leaf(facts["e"], graph["e"], frozenset(("e",)), facts)
    for v in ("n", "t", "s"):
        s = sm.combine(s, sm.leaf(facts[v], graph[v], frozenset((v,)), facts), frozenset((v,)), facts)
    assert s.chains == (3,)


def test_tiny_graph_is_one_kernel_and_right_when_calibrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled with a cached calibration (VFUSE_CACHE_DIR, VFUSE_CALIBRATION=on): one kernel, the eager result."""
    import vfuse
    from vfuse.targets import get_target
    from vfuse.targets.cpu import detect

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(10):
            x = torch.tanh(x * y + 0.5)
            x = x - x.mean(-1, keepdim=True)
        return x

    monkeypatch.setenv("VFUSE_CACHE_DIR", str(tmp_path))
    plain = get_target("cpu", calibrated=False)
    assert plain.isa is not None
    cal_mod.write(tmp_path, detect().fingerprint(), plain.isa.value, CAL)
    monkeypatch.setenv(cal_mod.ENV_VAR, "on")
    assert get_target("cpu").transcendental_f32 > 0
    for n in (64, 1, 97):
        x, y = torch.randn(3, n), torch.randn(3, n)
        g = vfuse.compile(fn, (x, y))
        got = g(x, y)
        assert g.stats.kernels == 1 and g.stats.torch_calls == 0
        torch.testing.assert_close(got, fn(x, y), rtol=1e-5, atol=1e-5)
