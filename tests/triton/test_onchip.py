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
    # 12 -> 6 -> 3 nodes, each size measured at re-tiling levels 0, 1, 2 first, plus the final check
    assert probe.calls == 10
    retiled = [d for d in plan.decisions if "re-tiled: level" in d.reason]
    assert [d.reason.split("re-tiled: ")[1][:7] for d in retiled[:2]] == ["level 1", "level 2"]


class RetileProbe(FakeProbe):
    """Spills at re-tiling level 0 only: fewer elements per thread are enough."""

    def __call__(self, plan: FusionPlan, sm: int) -> Mapping[int, OnChip]:
        self.calls += 1
        return {g.id: OnChip(sm, 40 if g.retile else 255, 0 if g.retile else 96, 0) for g in plan.groups}


def test_a_group_that_spills_is_re_tiled_before_it_is_split() -> None:
    graph = _chain(12)
    probe = RetileProbe(fits=0)
    plan = fit_on_chip(H100, probe, lambda b: plan_fusion(graph, H100, b))
    (group,) = plan.groups
    assert group.retile == 1 and probe.calls == 2
    (retile,) = [d for d in plan.decisions if d.rule is Rule.ONCHIP_SPILLS]
    assert "255 registers, 96 B spilled" in retile.reason and "re-tiled: level 1 of 2" in retile.reason
    (fits,) = [d for d in plan.decisions if d.rule is Rule.ONCHIP_FITS]
    assert "40 registers, 0 B spilled" in fits.reason and "(re-tiled, level 1)" in fits.reason


def test_re_tiled_groups_get_fewer_elements_per_thread() -> None:
    """The schedule reads `Group.retile`: half the elements per thread per level at the same
    warps (row chunks, a persistent row looped, pointwise blocks); a GEMM template gets half
    its larger side."""
    from vfuse.schedule import build

    def launches(fn: object, x: torch.Tensor, level: int, *more: torch.Tensor) -> list[object]:
        ctx = Context(Options(backend="triton", target="h100"), "g")
        graph = compiler.optimize(compiler.lower_fx(export(fn, (x, *more)).graph_module, ctx), ctx)
        plan = plan_fusion(graph, H100)
        plan = dataclasses.replace(plan, groups=tuple(dataclasses.replace(g, retile=level) for g in plan.groups))
        return [k.gpu for k in build(plan, H100, triton=True).kernels]

    looped = [launches(lambda t: torch.softmax(t, -1), torch.randn(4, 9001), lv)[0] for lv in (0, 1, 2)]
    assert [(g.block, g.warps) for g in looped] == [(2048, 8), (1024, 8), (512, 8)]  # 8, 4, 2 per thread
    row = [launches(lambda t: torch.softmax(t, -1), torch.randn(4, 6000), lv)[0] for lv in (0, 1)]
    assert row[0].persistent and not row[1].persistent and row[1].block == 1024 and row[1].merges
    flat = [launches(lambda t: t.tanh() * 2, torch.randn(64, 64), lv)[0] for lv in (0, 1)]
    assert flat[1].warps == flat[0].warps and 2 * flat[1].block == flat[0].block
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    gemm = [launches(lambda t, u: F.relu(t @ u), a, lv, b)[0] for lv in (0, 2)]
    assert gemm[0].block_m * gemm[0].block_n == 4 * gemm[1].block_m * gemm[1].block_n


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


def _gemm_heavy_epilogue(x: torch.Tensor, w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    a = x @ w
    e = F.gelu(a) * torch.tanh(p) + a * torch.sigmoid(q) + torch.exp(-a * p) + (q * a).tanh()
    return e + F.silu(p * a) * torch.erf(a * q) + p * a.sin() + q * a.cos() + (p - q) * a


def test_measured_spills_re_tile_a_gemm_epilogue(tmp_path: Path) -> None:
    """An fp32 GEMM whose epilogue holds many values per accumulator spills at the table's
    64x64 tile (4 warps) for sm_90; re-tiled to 32x64 it fits: one kernel, not split."""
    pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
    ctx = Context(Options(backend="triton", target="h100", cache_dir=tmp_path), "g0")
    ins = tuple(torch.randn(64, 64) for _ in range(4))
    graph = compiler.optimize(compiler.lower_fx(export(_gemm_heavy_epilogue, ins).graph_module, ctx), ctx)
    lavish = dataclasses.replace(H100, regs_per_thread=10**5, smem_per_sm=10**9)
    plan = fit_on_chip(lavish, compiler.TritonProbe(lavish, ctx), lambda b: plan_fusion(graph, lavish, b))
    (group,) = plan.groups
    assert group.retile >= 1
    (spill, *_) = [d for d in plan.decisions if d.rule is Rule.ONCHIP_SPILLS]
    (fits,) = [d for d in plan.decisions if d.rule is Rule.ONCHIP_FITS]
    print(spill.reason, "->", fits.reason)
    assert "re-tiled: level 1" in spill.reason and "0 B spilled" in fits.reason and "re-tiled, level" in fits.reason
