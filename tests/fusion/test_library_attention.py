"""Attention's template or torch's SDPA, and torch's vector width at a forced tier
(`fusion/library.py`, `schedule/contraction.library_choice`, `targets/cpu.at_tier`).

torch's libraries run at the CPU's own width whatever tier vfuse compiles for: AVX2 templates on an
AVX-512 Xeon face MKL at twice their width (`Target.library_gain`), which the uncalibrated verdicts
scale by. Attention now has a library side too, torch's fused SDPA (its CPU flash kernel: O(N) memory
like the template), at the calibrated ratio of the two (`library_attention_f32`) or the default.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from tests.fusion.fusion_patterns import FIXED_CPU

import vfuse
from vfuse.fusion.library import EFFICIENCY_RANGE, LIBRARY_EFFICIENCY, Efficiency, library_efficiency
from vfuse.fusion.rules import Rule
from vfuse.report.rows import RunKind
from vfuse.targets.cpu import at_tier
from vfuse.targets.isa import LANES, CpuIsa, Isa


def test_at_tier_records_torchs_width_over_the_tiers() -> None:
    machine = dataclasses.replace(FIXED_CPU, simd_lanes=16, isa=Isa.AVX512)
    avx2 = at_tier(machine, CpuIsa(Isa.AVX2, frozenset(), "x86_64"))
    assert avx2.library_gain == 16 / LANES[Isa.AVX2] == 2.0
    assert avx2.peak_f32 == pytest.approx(machine.peak_f32 / 2)  # the template at half the width
    assert at_tier(machine, CpuIsa(Isa.AVX512, frozenset(), "x86_64")).library_gain == 1.0
    generic = at_tier(machine, CpuIsa(Isa.GENERIC, frozenset(), "x86_64"))
    assert generic.library_gain == 16 / LANES[Isa.GENERIC]


def test_library_width_setting(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """VFUSE_LIBRARY_WIDTH: "cpu" (default) plans torch at the CPU's own width, "tier" as the forced
    tier's machines run it (the test suite's setting); anything else is refused, naming the variable."""
    from vfuse.errors import VfuseOptionError
    from vfuse.targets import get_target
    from vfuse.targets.cpu import machine_isa

    own = LANES[machine_isa().tier]
    wide = own / LANES[Isa.GENERIC]
    for value, gain in (("", wide), ("cpu", wide), ("tier", 1.0)):
        monkeypatch.setenv("VFUSE_LIBRARY_WIDTH", value)
        assert get_target("cpu", tmp_path, isa="generic").library_gain == gain
        assert get_target("cpu", tmp_path, isa=machine_isa().tier).library_gain == 1.0  # own tier: as wide
    monkeypatch.setenv("VFUSE_LIBRARY_WIDTH", "avx512")
    with pytest.raises(VfuseOptionError, match="VFUSE_LIBRARY_WIDTH='avx512'"):
        get_target("cpu", tmp_path, isa="generic")


def test_uncalibrated_verdicts_scale_by_the_gain_and_calibrated_ones_do_not() -> None:
    plain = dataclasses.replace(FIXED_CPU, library_f32=0.0, library_attention_f32=0.0, attention_f32=0.0)
    assert library_efficiency(plain) == Efficiency(LIBRARY_EFFICIENCY, False)
    forced = library_efficiency(dataclasses.replace(plain, library_gain=2.0))
    assert forced.ratio == forced.attention == min(2 * LIBRARY_EFFICIENCY, EFFICIENCY_RANGE[1])
    assert not forced.calibrated and "torch at 2x this tier's vector width" in forced.describe()
    # A calibration timed torch at its own width already: the gain is not applied twice.
    peak = plain.peak_f32
    cal = library_efficiency(dataclasses.replace(plain, library_gain=2.0, library_f32=1.1 * peak))
    assert cal.calibrated and cal.ratio == pytest.approx(1.1) and "torch at" not in cal.describe()
    assert cal.attention == forced.attention and not cal.for_attention().calibrated  # SDPA not timed: default
    sdpa = dataclasses.replace(plain, attention_f32=0.5 * peak, library_attention_f32=0.4 * peak)
    timed = library_efficiency(sdpa).for_attention()
    assert timed.calibrated and timed.ratio == pytest.approx(0.8)
    # Without the template's own attention rate, its GEMM peak is the reference; clamped both ways.
    alone = dataclasses.replace(plain, library_attention_f32=0.1 * peak)
    assert library_efficiency(alone).attention == EFFICIENCY_RANGE[0]


def _target_with(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """This machine's target uncalibrated, as a CPU whose torch runs at `library_gain` x the tier's width."""
    import vfuse.targets.cpu as cpu

    real = cpu.cpu_target
    clear = {"library_f32": 0.0, "library_attention_f32": 0.0}
    monkeypatch.setattr(cpu, "cpu_target", lambda *a, **k: dataclasses.replace(real(*a, **k), **clear, **fields))


def _sdpa_rows(fn, *inputs: torch.Tensor) -> list:
    rows = [k for k in vfuse.explain(fn, *inputs).kernels if k.runs is RunKind.TORCH]
    return [k for k in rows if Rule.LIBRARY_CONTRACTION.value in k.note]


def _qkv(*shape: int, kv_heads: int | None = None) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    kv = (*shape[:1], kv_heads or shape[1], *shape[2:])
    return torch.randn(*shape), torch.randn(*kv), torch.randn(*kv)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize(("gain", "library"), [(1.0, False), (2.0, True)])
def test_attention_goes_to_torchs_sdpa_where_the_template_is_predicted_slower(
    gain: float, library: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the default ratio the template is faster (measured 1.17x torch's flash SDPA at AVX-512, 2
    threads); AVX2 templates against AVX-512 torch lose (0.66x), and the report says so with both times."""
    _target_with(monkeypatch, library_gain=gain)
    q, k, v = _qkv(2, 4, 256, 64)
    rows = _sdpa_rows(_sdpa, q, k, v)
    assert len(rows) == int(library)
    if library:
        assert "torch predicted" in rows[0].note and "torch at 2x this tier's vector width" in rows[0].note
    compiled = vfuse.compile(_sdpa, (q, k, v), strict=True)
    torch.testing.assert_close(compiled(q, k, v), _sdpa(q, k, v), rtol=1e-4, atol=1e-5)


def _causal_written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v * 2.0 + q  # an epilogue the kernel after torch's SDPA fuses


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).relu()


@pytest.mark.parametrize("case", ["causal_written_out", "float_mask", "bool_mask", "gqa_causal", "odd_sizes"])
def test_attention_in_torch_matches_eager_with_masks_gqa_and_epilogues(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _target_with(monkeypatch, library_gain=2.0)
    if case == "causal_written_out":
        fn, inputs = _causal_written_out, _qkv(2, 4, 320, 64)
    elif case in ("float_mask", "bool_mask"):
        q, k, v = _qkv(2, 4, 257, 64)
        m = torch.randn(257, 257) if case == "float_mask" else torch.rand(2, 1, 257, 257) > 0.3
        fn, inputs = _masked, (q, k, v, m)
    elif case == "gqa_causal":
        fn, inputs = _gqa, _qkv(2, 8, 256, 64, kv_heads=2)
    else:  # prime sizes, a head dim of 17: the template's tails, or torch's
        fn, inputs = _sdpa, _qkv(3, 5, 211, 17)
    rows = _sdpa_rows(fn, *inputs)
    compiled = vfuse.compile(fn, inputs, strict=True)
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)
    if case != "odd_sizes":  # big enough for the torch call to pay off
        assert len(rows) == 1 and compiled.stats.kernels <= 2  # torch's SDPA and at most one fused epilogue


def test_attention_with_vfuses_dropout_and_trainings_forms_stay_templates() -> None:
    """torch's SDPA would draw its own mask, not vfuse's counter-based one (the same on CPU and GPU);
    the training forms (with the logsumexp, the backward) have no torch op of the same contract."""
    from types import SimpleNamespace

    from tests.fusion.test_library import _cost

    from vfuse.ir import Op
    from vfuse.schedule.contraction import library_choice

    eager = Efficiency(1.5, False, 1.5, 2.0)
    cost = _cost(compute_s=1e-2)
    for op, attrs in ((Op.SDPA, {"dropout": 0.25}), (Op.SDPA_LSE, {}), (Op.SDPA_BACKWARD, {}), (Op.SDPA, {})):
        kernel = SimpleNamespace(op=op, attrs=attrs, epilogue=(), node="o")
        cp = SimpleNamespace(kernel=kernel, rest=(), prologue=frozenset())
        graph = {"o": SimpleNamespace(type=SimpleNamespace(nbytes=1 << 20))}
        choice = library_choice(graph, cost, cp, eager)  # type: ignore[arg-type]
        assert choice.library == (op is Op.SDPA and not attrs), op


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _llama_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """LLaMA's: RoPE on q and k, GQA's heads expanded, a causal mask computed from positions."""
    t, d = q.shape[-2], q.shape[-1]
    pos = torch.arange(t, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(0, d, 2) / d))
    cos, sin = torch.cat((pos, pos), -1).cos(), torch.cat((pos, pos), -1).sin()
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    rep = q.shape[1] // k.shape[1]
    k = k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(q.shape)
    v = v[:, :, None].expand(-1, -1, rep, -1, -1).reshape(q.shape)
    i = torch.arange(t)
    mask = i[None, :] <= i[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_producers_torch_would_run_op_by_op_keep_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLaMA's attention group computes RoPE, the expanded K/V heads and the mask before the SDPA: the
    template does it while loading, torch op by op (session 27, forced AVX2: 1.2 ms in torch, 0.23 ms in
    the template). Priced (`producers_s`), it stays a template even against torch at twice its width,
    while the same attention on ready operands goes to torch."""
    _target_with(monkeypatch, library_gain=2.0)
    q, k, v = _qkv(2, 4, 128, 64, kv_heads=2)
    report = vfuse.explain(_llama_attention, q, k, v)
    assert [r.runs for r in report.kernels if r.runs is not RunKind.NATIVE] == [RunKind.TEMPLATE]
    qe, ke, ve = q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    assert len(_sdpa_rows(_sdpa, qe, ke, ve)) == 1
    compiled = vfuse.compile(_llama_attention, (q, k, v), strict=True)
    torch.testing.assert_close(compiled(q, k, v), _llama_attention(q, k, v), rtol=1e-4, atol=1e-4)


def test_producers_price_views_as_dispatches_and_other_ops_as_calls_and_passes() -> None:
    from vfuse.fusion.library import LIBRARY_CALL_S, VIEW_CALL_S, producers_s
    from vfuse.ir import GraphBuilder, Op, TensorType, verify
    from vfuse.ir.types import DType

    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((256, 1024), DType.F32))
    t = b.add(Op.PERMUTE, (x,), name="t", perm=(1, 0))
    e = b.add(Op.EXP, (t,), name="e")
    g = verify(b.build([e]))
    assert producers_s(["x", "t"], g, 1e9) == VIEW_CALL_S  # an input is not run at all
    assert producers_s(["e"], g, 1e9) == pytest.approx(LIBRARY_CALL_S + 2 * 256 * 1024 * 4 / 1e9)
