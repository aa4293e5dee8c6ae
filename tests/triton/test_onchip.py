"""The on-chip pressure rule, measured (fusion/onchip.py): groups whose kernel spills or overflows shared
memory are split and re-planned; every decision carries the measured figures. With a fake probe
(the splitting policy) and with the real one (Triton kernels compiled offline for sm_90)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import inputs

import vfuse
from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.fusion import FusionPlan, plan_fusion
from vfuse.fusion.onchip import OnChip, fit_on_chip
from vfuse.fusion.rules import Rule
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.targets import get_target

H100 = get_target("h100")


def _chain(n: int) -> Graph:
    """x -> tanh -> *2 -> tanh -> ... : n pointwise nodes, one kernel when planned."""
    b = GraphBuilder()
    (x,) = inputs(b, ((37, 41), DType.F32))
    v = x
    for i in range(n):
        v = b.add(Op.TANH, [v]) if i % 2 == 0 else b.add(Op.MUL, [v, v])
    return b.build([v])


class FakeProbe:
    """Spills when a group has more than `fits` nodes; shared memory per its `shared` map."""

    def __init__(self, fits: int, shared: int = 0) -> None:
        self.fits, self.shared, self.calls = fits, shared, 0

    def __call__(self, plan: FusionPlan, sm: int) -> Mapping[int, OnChip]:
        self.calls += 1
        return {
            g.id: OnChip(
                sm, 255 if len(g.nodes) > self.fits else 40, 96 if len(g.nodes) > self.fits else 0, self.shared
            )
            for g in plan.groups
        }


def test_a_group_that_spills_is_split_until_its_kernels_fit() -> None:
    graph = _chain(12)
    assert len(plan_fusion(graph, H100).groups) == 1
    probe = FakeProbe(fits=3)
    plan = fit_on_chip(H100, probe, lambda b: plan_fusion(graph, H100, b))
    assert all(len(g.nodes) <= 3 for g in plan.groups) and sum(len(g.nodes) for g in plan.groups) == 12
    splits = [d for d in plan.decisions if d.rule is Rule.ONCHIP_SPILLS and "split" in d.reason]
    assert "measured sm_90: 255 registers, 96 B spilled, 0 B shared" in splits[0].reason
    assert "at most 6 of its 12 nodes" in splits[0].reason
    fits = [d for d in plan.decisions if d.rule is Rule.ONCHIP_FITS]
    assert len(fits) == len(plan.groups) and "40 registers, 0 B spilled" in fits[0].reason
    accepted = [d for d in plan.decisions if d.accepted and d.rule is not Rule.ONCHIP_FITS]
    assert accepted and all("measured sm_90: 40 registers" in d.reason for d in accepted)
    assert probe.calls == 4  # 12 -> 6 -> 3 nodes: three plans measured, plus the final check


def test_shared_memory_over_the_preset_splits_and_one_node_is_kept() -> None:
    graph = _chain(2)
    too_much = H100.smem_per_sm + 1024
    plan = fit_on_chip(H100, FakeProbe(fits=99, shared=too_much), lambda b: plan_fusion(graph, H100, b))
    shared = [d for d in plan.decisions if d.rule is Rule.ONCHIP_SHARED]
    assert len(plan.groups) == 2
    assert any("split" in d.reason for d in shared) and any("kept: it cannot be split" in d.reason for d in shared)
    assert f"{too_much} B shared" in shared[0].reason


def test_a_split_plan_runs_and_matches_eager(tmp_path: Path) -> None:
    """The split plan is a plan like any other: scheduled, rendered and run by the Triton backend."""
    pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
    from vfuse.codegen.triton import render
    from vfuse.runtime.triton import TritonExecutor

    graph = _chain(6)
    plan = fit_on_chip(H100, FakeProbe(fits=2), lambda b: plan_fusion(graph, H100, b))
    assert len(plan.groups) > 1 and all(len(g.nodes) <= 2 for g in plan.groups)
    program = compiler.schedule(plan, H100, Context(Options(backend="triton", target="h100"), "g"), templates=False)
    assert len([k for s in program.segments for k in s.kernels]) == len(plan.groups)
    x = torch.randn(37, 41)
    (got,) = TritonExecutor(plan, program, render(program), tmp_path)([x])
    want = x
    for i in range(6):
        want = torch.tanh(want) if i % 2 == 0 else want * want
    torch.testing.assert_close(got, want)


def _row_chain(x: torch.Tensor) -> torch.Tensor:
    """14 softmaxes over one 8192-wide row, each result kept to the end: many live rows."""
    ys = [x]
    for _ in range(14):
        ys.append(torch.softmax(ys[-1] * 2 + x, -1))
    return sum(ys)  # type: ignore[return-value]


def test_measured_spills_split_a_row_kernel(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
    """The cost model is told the GPU has unlimited registers and shared memory, so it fuses the
    whole chain; compiled for sm_90 the kernel spills, and the measured rule splits it."""
    ctx = Context(Options(backend="triton", target="h100", cache_dir=tmp_path), "g0")
    graph = compiler.optimize(compiler.lower_fx(export(_row_chain, (torch.randn(64, 8192),)).graph_module, ctx), ctx)
    lavish = dataclasses.replace(H100, regs_per_thread=10**5, smem_per_sm=10**9)
    assert len(plan_fusion(graph, lavish).groups) <= 3
    plan = fit_on_chip(lavish, compiler.TritonProbe(lavish, ctx), lambda b: plan_fusion(graph, lavish, b))
    spills = [d for d in plan.decisions if d.rule is Rule.ONCHIP_SPILLS and "split" in d.reason]
    assert spills and " B spilled" in spills[0].reason and "registers" in spills[0].reason
    fits = [d for d in plan.decisions if d.rule is Rule.ONCHIP_FITS]
    assert len(fits) == len(plan.groups) and all(" 0 B spilled" in d.reason for d in fits)


def test_explain_shows_registers_spills_and_shared_memory(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
    x, w = torch.randn(8, 96), torch.randn(96)
    report = vfuse.explain(lambda t, g: F.gelu(F.layer_norm(t, (96,), g)), x, w, target="h100", cache_dir=tmp_path)
    fits = [d for d in report.decisions if d.rule is Rule.ONCHIP_FITS]
    assert fits and "sm_90: " in fits[0].reason and " registers, 0 B spilled, " in fits[0].reason
    assert any(d.accepted and "measured sm_90" in d.reason for d in report.decisions if d.rule is not Rule.ONCHIP_FITS)
    assert "registers, 0 B spilled" in report.to_text(width=400)
