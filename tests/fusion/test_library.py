"""Template or library (`fusion/library.py`): the cost model keeps a contraction in torch when its
template would compute mostly padding, fuses the epilogue after it, and the report says why."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.fusion.library import (
    EFFICIENCY_RANGE,
    LIBRARY_CALL_S,
    LIBRARY_EFFICIENCY,
    Efficiency,
    choose,
    choose_gpu,
    library_efficiency,
    tile_waste,
)
from vfuse.fusion.plan import Cost
from vfuse.fusion.rules import Rule
from vfuse.report.rows import RunKind
from vfuse.targets import get_target


def _cost(compute_s: float, memory_s: float = 1e-6, nbytes: int = 1 << 20) -> Cost:
    return Cost(1, nbytes, compute_s, memory_s, 2e-6, 2e-6 + compute_s + memory_s, 0.5, 1.0)


def test_tile_waste() -> None:
    assert tile_waste(256, 1024, 8, 64) == 1.0
    assert tile_waste(256, 3, 8, 64) == pytest.approx(64 / 3)
    assert tile_waste(7, 5, 8, 8) == pytest.approx(64 / 35)
    assert tile_waste(0, 5, 8, 8) == 1.0  # empty: nothing to waste (and no division by zero)


def test_choice_weighs_waste_against_the_call_and_the_lost_epilogue() -> None:
    big = _cost(compute_s=1e-3)
    assert not choose(big, 1.0, 1 << 20, epilogue=True).library  # full tiles: the template
    assert choose(big, 20.0, 1 << 20, epilogue=True).library  # 20x padding: torch
    tiny = _cost(compute_s=1e-7)
    assert not choose(tiny, 20.0, 1 << 20, epilogue=False).library  # waste < one torch call
    # The epilogue pass counts: the same waste that wins without one loses with a large output.
    mid = _cost(compute_s=2 * LIBRARY_CALL_S)
    assert choose(mid, 2.0, 0, epilogue=False).library
    assert not choose(mid, 2.0, 64 << 20, epilogue=True).library
    reason = choose(big, 20.0, 1 << 20, epilogue=True).reason()
    assert reason.startswith(f"{Rule.LIBRARY_CONTRACTION.value}: torch predicted")


class Head(torch.nn.Module):
    """A regression head: Linear(d, 1) with GELU, an output one column wide."""

    def __init__(self, d: int, out: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x)) * 2.0


def _slow_gemm_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's target with a fixed 20 Gflop/s GEMM peak: the verdict on a narrow output weighs the
    tile's padding flops against one torch call, so it flips with the measured peak (a Zen 3 measured at
    138 Gflop/s keeps the 1- and 3-column heads in the template, timed level with torch there; a Zen 4
    sends them to torch). A fixed peak tests the mechanism on every machine."""
    import vfuse.targets.cpu as cpu

    real = cpu.cpu_target
    monkeypatch.setattr(cpu, "cpu_target", lambda *a, **k: dataclasses.replace(real(*a, **k), peak_f32=20e9))


@pytest.mark.parametrize(("out", "library"), [(1, True), (3, True), (256, False)])
def test_narrow_linear_runs_in_torch_with_its_epilogue_fused(
    out: int, library: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_gemm_target(monkeypatch)
    torch.manual_seed(0)
    model, x = Head(256, out).eval(), torch.randn(193, 256)  # 193 rows: prime, ragged tiles
    report = vfuse.explain(model, x, freeze=True)
    torch_rows = [k for k in report.kernels if k.runs is RunKind.TORCH]
    assert bool(torch_rows) == library
    if library:
        (row,) = torch_rows
        assert Rule.LIBRARY_CONTRACTION.value in row.note
        assert any(k.runs is RunKind.NATIVE for k in report.kernels)  # GELU and * 2 still fused
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("hw", "stride", "library"), [(8, 1, True), (16, 2, True), (32, 1, False)])
def test_small_plane_stride1_conv_goes_to_torch(hw: int, stride: int, library: bool) -> None:
    # 3x3 convs on the direct path compute padded-width columns: an 8x8 output plane is 72 columns
    # (stride 1: W + 2; stride 2 from 16x16: one column phase, 9 wide), in 32- or 64-wide tiles at
    # AVX-512 for 64 outputs (Zen 4, 1 thread: template 680 us, torch 420). A 32x32 plane (1056) wastes
    # little. At 8 lanes or fewer the 8x8 planes take compact columns (64, no waste:
    # microtile.compact_conv_columns) and stay in the template.
    library = library and get_target("cpu").simd_lanes > 8
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, stride, 1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 128, hw, hw)
    rows = [k for k in vfuse.explain(model, x, freeze=True).kernels if k.runs is RunKind.TORCH]
    assert [Rule.LIBRARY_CONTRACTION.value in k.note for k in rows] == ([True] if library else [])
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_gpu_choice_uses_the_measured_share_per_family() -> None:
    # Compute-bound and large: the library's measured share wins (conv and attention by far).
    big = Cost(1, 64 << 20, 300e-6, 30e-6, 3e-6, 333e-6, 0.5, 1.0)
    for family in ("gemm", "conv", "attention"):
        assert choose_gpu(big, family, 1 << 20, epilogue=False).library, family
    # Small: one launch and the epilogue in registers beat the library's faster core.
    small = Cost(1, 1 << 16, 2e-6, 1e-6, 3e-6, 6e-6, 0.5, 1.0)
    for family in ("gemm", "conv", "attention"):
        assert not choose_gpu(small, family, 1 << 16, epilogue=True).library, family
    # A split epilogue's pass over a large output outweighs the GEMM's 16 % (not conv's 77 %).
    mid = Cost(1, 64 << 20, 60e-6, 20e-6, 3e-6, 83e-6, 0.5, 1.0)
    assert not choose_gpu(mid, "gemm", 16 << 20, epilogue=True).library
    assert choose_gpu(mid, "conv", 16 << 20, epilogue=True).library
    # Memory-bound: the library cannot go below the group's memory time.
    flat = Cost(1, 64 << 20, 10e-6, 100e-6, 3e-6, 103e-6, 0.5, 1.0)
    assert not choose_gpu(flat, "conv", 1 << 20, epilogue=False).library


@pytest.mark.parametrize(("seq", "library"), [(33, False), (2048, True)])
def test_gpu_attention_goes_to_torchs_sdpa_where_the_template_is_measured_slower(seq: int, library: bool) -> None:
    q, k, v = (torch.randn(2, 8, seq, 64, dtype=torch.bfloat16) for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    report = vfuse.explain(fn, q, k, v, backend="triton", target="h200")
    rows = [r for r in report.kernels if r.runs is RunKind.TORCH]
    assert [Rule.LIBRARY_CONTRACTION.value in r.note for r in rows] == ([True] if library else [])


def test_small_plane_conv_stays_a_template_at_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """At AVX2 the direct conv computes an 8x8 plane as 64 compact columns (no garbage column, whole
    6x16 tiles) and reads its weight from L2 per M block: no waste, so the template runs it (measured
    on Zen 3, one thread: 128 -> 128 channels a tie with torch's conv, 256 -> 256 within +-6 %). On an
    AVX2 CPU: torch's conv at the tier's width (`Target.library_gain` 1)."""
    from vfuse.targets.cpu import machine_flags

    if not {"avx2", "fma"} <= set(machine_flags()):
        pytest.skip("needs an AVX2 CPU")
    _replaced_target(monkeypatch, library_gain=1.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, 1, 1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 128, 8, 8)
    rows = [k for k in vfuse.explain(model, x, freeze=True, isa="avx2").kernels if k.runs is RunKind.TORCH]
    assert rows == []
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True, isa="avx2")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_library_efficiency_is_the_calibrated_ratio() -> None:
    base = get_target("cpu")
    plain = dataclasses.replace(base, library_f32=0.0, library_attention_f32=0.0, library_gain=1.0)
    assert library_efficiency(plain) == Efficiency(LIBRARY_EFFICIENCY, False)
    eff = library_efficiency(dataclasses.replace(base, peak_f32=100e9, library_f32=97e9))
    assert eff.calibrated and eff.ratio == pytest.approx(0.97)
    # One disturbed measurement cannot send everything to torch (or keep 2x padding in the template).
    assert library_efficiency(dataclasses.replace(base, peak_f32=100e9, library_f32=900e9)).ratio == EFFICIENCY_RANGE[1]
    assert library_efficiency(dataclasses.replace(base, peak_f32=100e9, library_f32=1e9)).ratio == EFFICIENCY_RANGE[0]


def test_the_ratio_moves_the_verdict() -> None:
    big = _cost(compute_s=1e-3)
    # 5 % of padding: the default ratio (the template 11 % faster on whole tiles) keeps the template; a
    # tier calibrated at parity sends it to torch, whose library covers the edge.
    assert not choose(big, 1.05, 0, epilogue=False).library
    assert choose(big, 1.05, 0, epilogue=False, efficiency=Efficiency(1.0, True)).library
    assert not choose(big, 1.05, 0, epilogue=False, efficiency=Efficiency(0.9, True)).library
    reason = choose(big, 1.05, 0, epilogue=False, efficiency=Efficiency(1.0, True)).reason()
    assert reason.endswith("(library at 1.00x the template's rate, calibrated)")


def _replaced_target(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """This machine's target, at whatever tier, with `fields` replaced (`peak_ratio`: library_f32 as
    that ratio of its peak_f32)."""
    import vfuse.targets.cpu as cpu

    real, ratio = cpu.cpu_target, fields.pop("peak_ratio", None)

    def target(*a: object, **k: object) -> object:
        t = real(*a, **k)  # type: ignore[arg-type]
        extra = {} if ratio is None else {"library_f32": float(ratio) * t.peak_f32}  # type: ignore[arg-type]
        return dataclasses.replace(t, **fields, **extra)

    monkeypatch.setattr(cpu, "cpu_target", target)


def _calibrated_target(monkeypatch: pytest.MonkeyPatch, ratio: float) -> None:
    """This machine's target as if calibrated with torch's GEMM at `ratio` of the template's rate."""
    _replaced_target(monkeypatch, peak_ratio=ratio)


@pytest.mark.parametrize(("ratio", "library"), [(0.9, False), (1.3, True)])
def test_calibrated_ratio_decides_a_ragged_gemm(ratio: float, library: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMM whose rows are not whole register tiles (97 rows: 1-5 % of padding) and no epilogue:
    a tier whose library measured 1.3x the template's rate runs it in torch, one at 0.9x in the
    template; both match eager, and the report names the ratio and where it came from."""
    _calibrated_target(monkeypatch, ratio)
    torch.manual_seed(0)
    a, b = torch.randn(97, 384), torch.randn(384, 256)
    rows = [k for k in vfuse.explain(torch.mm, a, b).kernels if k.runs is RunKind.TORCH]
    assert [Rule.LIBRARY_CONTRACTION.value in k.note for k in rows] == ([True] if library else [])
    if library:
        assert f"library at {ratio:.2f}x the template's rate, calibrated" in rows[0].note
    compiled = vfuse.compile(torch.mm, (a, b), strict=True)
    torch.testing.assert_close(compiled(a, b), a @ b, rtol=1e-4, atol=1e-4)


def _thin_and_square_gemms() -> tuple[object, object]:
    from vfuse.ir import GraphBuilder, Op, TensorType, verify
    from vfuse.ir.types import DType

    graphs = []
    for m, k, n in ((1024, 8, 1024), (384, 384, 384)):
        b = GraphBuilder()
        a = b.add(Op.INPUT, name="a", index=0, type=TensorType((m, k), DType.F32))
        w = b.add(Op.INPUT, name="w", index=1, type=TensorType((k, n), DType.F32))
        graphs.append(verify(b.build([b.add(Op.MATMUL, (a, w), name="mm")])))
    return graphs[0], graphs[1]


def test_each_side_pays_its_own_calibrated_overheads() -> None:
    """On a calibrated target the template's per-element and per-call overheads (`cost.template_extra_s`)
    are in the group's cost; the library side pays torch's own (`library_elem_s`, `library_call_s`), not
    the template's too. With torch's overheads a quarter of the template's, a K = 8 GEMM (mostly packing
    and storing C) runs in torch and a square GEMM (mostly flops, torch's rate 0.85x) stays a template;
    with equal overheads they cancel and both stay templates, as without a calibration."""
    from tests.fusion.fusion_patterns import FIXED_CPU

    from vfuse.fusion import estimate

    plain = dataclasses.replace(FIXED_CPU, library_f32=0.85 * FIXED_CPU.peak_f32)
    template = {"contraction_elem_s": 0.4e-9, "contraction_call_s": 1e-6}
    cheap = dataclasses.replace(plain, **template, library_elem_s=0.1e-9, library_call_s=1e-6)
    equal = dataclasses.replace(plain, **template, library_elem_s=0.4e-9, library_call_s=1e-6)
    eff = library_efficiency(plain)
    verdicts = {}
    for name, g in zip(("thin", "square"), _thin_and_square_gemms()):
        out = g["mm"].type.nbytes
        c0 = estimate(["mm"], g, plain)
        v0 = choose(c0, 1.0, out, False, eff)
        assert c0.template_s == c0.library_extra_s == 0 and not v0.library
        for target in (cheap, equal):
            c = estimate(["mm"], g, target)
            v = choose(c, 1.0, out, False, eff)
            assert c.template_s > 0 and v.template_s == pytest.approx(c.time_s)  # the template pays once
            assert v.library_s == pytest.approx(v0.library_s + c.library_extra_s)  # torch: its own alone
            verdicts[name, target is cheap] = v.library
    assert verdicts == {("thin", True): True, ("square", True): False, ("thin", False): False, ("square", False): False}


def test_a_memory_bound_contraction_is_not_faster_in_wider_vectors() -> None:
    """The library's rate speeds up the compute only: K = 64 (16384 x 64 -> 4096) is bound by writing its
    output, and torch's GEMM at twice the width took 80 ms against the template's 62 (session 27)."""
    bound = _cost(compute_s=1e-3, memory_s=10e-3, nbytes=256 << 20)
    fast = choose(bound, 1.0, 0, epilogue=False, efficiency=Efficiency(1.5, True))
    assert fast.library_s >= bound.memory_s  # never under its own memory traffic
    compute = _cost(compute_s=30e-3, memory_s=1e-3)
    assert choose(compute, 1.0, 0, False, Efficiency(1.5, True)).library_s < compute.time_s * 0.75


def test_torch_pays_for_a_fresh_output_past_the_mmap_threshold() -> None:
    from vfuse.fusion.library import FRESH_FROM_BYTES, fresh_output_s

    big = _cost(compute_s=40e-3)
    small_out, large_out = FRESH_FROM_BYTES - 4, 256 << 20
    assert fresh_output_s(small_out) == 0.0 and fresh_output_s(large_out) > 15e-3
    gap = choose(big, 1.0, large_out, False).library_s - choose(big, 1.0, small_out, False).library_s
    assert gap == pytest.approx(fresh_output_s(large_out))
