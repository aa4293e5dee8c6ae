"""Calibration of the cpu target on vfuse's kernels (targets/calibrate.py): the plausibility guard,
the per-tier cache keyed by CPU fingerprint, how a Target is derived from it and for fewer threads,
and what the cost model does with it (bandwidth by bytes without a step, serial small kernels)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from vfuse.errors import VfuseOptionError
from vfuse.fusion.cost import Figures, Pressure, cost_from, memory_bw
from vfuse.ir import Kind
from vfuse.targets import Target, get_target
from vfuse.targets import calibrate as cal_mod
from vfuse.targets.calibrate import Calibration, apply, at_threads, guarded
from vfuse.targets.cpu import detect

BASE = Target(
    "cpu", "cpu", 2, 16, 32 << 10, 1 << 20, 32 << 20, 0, 32, 32,
    20e9, 60e9, 200e9, 200e9, 400e9, 800e9, 160e9, 2e-6, 2,
)  # fmt: skip
CAL = Calibration(
    l1_bw=180e9,
    l2_bw=96e9,
    l3_bw=90e9,
    dram_bw=15e9,
    vector_f32=50e9,
    transcendental_f32=18e9,
    peak_f32=105e9,
    serial_launch_s=3e-8,
    launch_s=1.5e-6,
)


def test_guard_keeps_plausible_values_and_replaces_the_rest() -> None:
    kept, bad = guarded(CAL, BASE)
    assert kept == CAL and bad == []
    wild = dataclasses.replace(CAL, dram_bw=1e3, peak_f32=1e15, serial_launch_s=0.0, launch_s=0.01)
    fixed, bad = guarded(wild, BASE)
    assert bad == ["dram_bw", "peak_f32", "serial_launch_s", "launch_s"]
    assert fixed.dram_bw == BASE.dram_bw / 2 and fixed.peak_f32 == BASE.peak_f32 / 2
    assert fixed.launch_s == 0.0 and fixed.l2_bw == CAL.l2_bw  # 0: keep the target's launch_s
    # The library's GEMM rate: 0 is "not measured" (the cost model's default ratio), a wild one is dropped.
    assert guarded(dataclasses.replace(CAL, library_f32=95e9), BASE) == (dataclasses.replace(CAL, library_f32=95e9), [])
    fixed, bad = guarded(dataclasses.replace(CAL, library_f32=1e15), BASE)
    assert bad == ["library_f32"] and fixed.library_f32 == 0.0


def test_the_library_rate_is_judged_at_the_cpus_own_width() -> None:
    """torch's GEMM runs at the CPU's own width whatever tier vfuse compiles for: at the forced
    avx2 tier of an AVX-512 CPU (8 of 16 lanes: 40 G flop/s of vector per core), 184 G flop/s is
    plausible (measured on a Xeon), 3x the tier's vector rate is not the bound."""
    avx2 = dataclasses.replace(BASE, simd_lanes=8, vector_f32=80e9)
    measured = dataclasses.replace(CAL, library_f32=184e9)
    assert guarded(measured, avx2)[1] == ["library_f32"]
    assert guarded(measured, avx2, library_lanes=16) == (measured, [])
    assert guarded(dataclasses.replace(CAL, library_f32=1e15), avx2, library_lanes=16)[1] == ["library_f32"]


def test_apply_scales_per_thread_rates_to_the_cores() -> None:
    t = apply(BASE, CAL)
    assert (t.l1_bw, t.l2_bw, t.cache_bw, t.dram_bw_thread) == (360e9, 192e9, 180e9, 15e9)
    assert (t.vector_f32, t.transcendental_f32, t.peak_f32) == (100e9, 36e9, 210e9)
    assert t.peak_bf16 == 2 * t.peak_f32 and t.peak_i8 == 4 * t.peak_f32  # the tier's ratios kept
    assert t.dram_bw == max(BASE.dram_bw, CAL.dram_bw) and t.dram_bw_thread == CAL.dram_bw
    assert (t.serial_launch_s, t.launch_s) == (3e-8, 1.5e-6)
    one = at_threads(t, 1)
    assert (one.cores, one.max_threads, one.l2_bw, one.vector_f32, one.transcendental_f32) == (1, 1, 96e9, 50e9, 18e9)
    assert one.dram_bw == CAL.dram_bw and one.launch_s == CAL.serial_launch_s
    assert at_threads(t, 2) is t
    lib = apply(BASE, dataclasses.replace(CAL, library_f32=95e9))
    assert lib.library_f32 == 190e9 and at_threads(lib, 1).library_f32 == 95e9  # per thread, like the peak
    assert t.library_f32 == 0.0  # a calibration without it: unknown


def test_cache_is_per_tier_and_per_cpu(tmp_path: Path) -> None:
    cal_mod.write(tmp_path, "cpu-a", "avx2", CAL)
    other = dataclasses.replace(CAL, peak_f32=99e9)
    cal_mod.write(tmp_path, "cpu-a", "avx512", other)
    assert cal_mod.read(tmp_path, "cpu-a", "avx2") == CAL
    assert cal_mod.read(tmp_path, "cpu-a", "avx512") == other
    assert cal_mod.read(tmp_path, "cpu-b", "avx2") is None  # another CPU's figures are not used
    assert cal_mod.read(tmp_path, "cpu-a", "generic") is None
    cal_mod.write(tmp_path, "cpu-a", "avx512", None)  # a new calibration starts from none (other tiers kept)
    assert cal_mod.read(tmp_path, "cpu-a", "avx512") is None and cal_mod.read(tmp_path, "cpu-a", "avx2") == CAL
    (tmp_path / cal_mod.CALIBRATION_FILE).write_text("{not json")
    assert cal_mod.read(tmp_path, "cpu-a", "avx2") is None


def test_a_calibration_cached_before_the_library_rate_reads_as_unknown(tmp_path: Path) -> None:
    entry = dataclasses.asdict(CAL)
    del entry["library_f32"]
    doc = {"version": cal_mod.CALIBRATION_VERSION, "fingerprint": "cpu-a", "tiers": {"avx2": entry}}
    (tmp_path / cal_mod.CALIBRATION_FILE).write_text(json.dumps(doc))
    assert cal_mod.read(tmp_path, "cpu-a", "avx2") == CAL and CAL.library_f32 == 0.0


def test_the_measured_target_cache_has_no_calibrated_only_fields(tmp_path: Path) -> None:
    """library_f32 comes from a calibration alone: target_cpu.json is written without it, so caches of
    earlier versions (and earlier versions reading this one) stay valid."""
    from vfuse.targets.cpu import CALIBRATED_ONLY

    plain = get_target("cpu", tmp_path)
    data = json.loads((tmp_path / "target_cpu.json").read_text())
    assert CALIBRATED_ONLY and not CALIBRATED_ONLY & set(data["target"]) and plain.library_f32 == 0.0
    mtime = (tmp_path / "target_cpu.json").stat().st_mtime_ns
    assert get_target("cpu", tmp_path) == plain  # read back, not measured again
    assert (tmp_path / "target_cpu.json").stat().st_mtime_ns == mtime


def test_cpu_target_applies_the_cached_tier(tmp_path: Path) -> None:
    plain = get_target("cpu", tmp_path)
    assert plain.l2_bw == 0 and plain.serial_launch_s == 0
    assert plain.isa is not None
    cal_mod.write(tmp_path, detect().fingerprint(), plain.isa.value, CAL)
    calibrated = get_target("cpu", tmp_path, calibrated=True)  # the suite pins VFUSE_CALIBRATION=off
    assert calibrated.l2_bw == CAL.l2_bw * plain.cores and calibrated.serial_launch_s == CAL.serial_launch_s
    data = json.loads((tmp_path / cal_mod.CALIBRATION_FILE).read_text())
    assert data["fingerprint"] == detect().fingerprint()


def test_calibration_off_plans_with_the_measured_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VFUSE_CALIBRATION=off (the suite's setting, tests/conftest.py) ignores a cached calibration, so a
    developer's `vfuse calibrate` cannot change what the tests plan; unset or on applies it."""
    plain = get_target("cpu", tmp_path, calibrated=False)
    assert plain.isa is not None
    cal_mod.write(tmp_path, detect().fingerprint(), plain.isa.value, CAL)
    monkeypatch.setenv(cal_mod.ENV_VAR, "off")
    assert get_target("cpu", tmp_path) == plain
    for value in ("on", ""):
        monkeypatch.setenv(cal_mod.ENV_VAR, value)
        assert get_target("cpu", tmp_path).l2_bw == CAL.l2_bw * plain.cores
    assert get_target("cpu", tmp_path, calibrated=False) == plain  # the argument wins over the variable
    monkeypatch.setenv(cal_mod.ENV_VAR, "sometimes")
    with pytest.raises(VfuseOptionError, match="VFUSE_CALIBRATION='sometimes'"):
        get_target("cpu", tmp_path)


def test_the_cache_dir_variable_names_the_target_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """get_target without a directory reads VFUSE_CACHE_DIR, the directory compiles use
    (Options.from_env), so both see one measurement and one calibration."""
    from vfuse.context import Options

    monkeypatch.setenv("VFUSE_CACHE_DIR", str(tmp_path))
    plain = get_target("cpu", calibrated=False)
    assert plain.isa is not None and Options.from_env().cache_dir == tmp_path
    cal_mod.write(tmp_path, detect().fingerprint(), plain.isa.value, CAL)
    assert get_target("cpu", calibrated=True).l2_bw == CAL.l2_bw * plain.cores


def _figures(nbytes: int, domain: int, kind: Kind = Kind.ELEMENTWISE) -> Figures:
    return Figures(domain, 0.0, nbytes // 2, nbytes - nbytes // 2, kind, domain, 0, Pressure(4, 32, 0, 0, 1))


def test_bandwidth_falls_with_bytes_without_a_step() -> None:
    t = apply(BASE, CAL)
    assert memory_bw(BASE, 1 << 10) == memory_bw(BASE, 1 << 30) == BASE.dram_bw  # uncalibrated: unchanged
    sizes = [int(2 ** (k / 4)) for k in range(40, 120)]
    bws = [memory_bw(t, s) for s in sizes]
    assert bws[0] == t.l1_bw and bws[-1] == t.dram_bw
    assert memory_bw(t, t.l2_bytes) == pytest.approx(t.l2_bw)  # half of the two cores' L2
    assert all(a >= b * (1 - 1e-12) for a, b in itertools.pairwise(bws))
    times = [s / b for s, b in zip(sizes, bws)]
    assert all(a < b for a, b in itertools.pairwise(times))  # more bytes always take longer
    assert max(a / b for a, b in itertools.pairwise(bws)) < 1.5  # no step (the anchors are 9x apart)


def test_small_kernels_run_serially_once_calibrated() -> None:
    t = apply(BASE, CAL)
    small = cost_from(_figures(4096, 1024), t)
    assert small.launch_s == CAL.serial_launch_s and small.parallelism == pytest.approx(0.5)
    big = cost_from(_figures(1 << 22, 1 << 20), t)
    assert big.launch_s == t.launch_s
    gemm = cost_from(_figures(4096, 1024, Kind.CONTRACTION), t)
    assert gemm.launch_s == t.launch_s  # contraction templates always fork
    assert cost_from(_figures(4096, 1024), BASE).launch_s == BASE.launch_s


def test_calibrating_vfuse_kernels_at_the_avx2_tier(tmp_path: Path) -> None:
    """A real (short) calibration at the forced avx2 tier: every figure measured on vfuse's own
    kernels is cached for avx2 alone and read back into that tier's target."""
    from vfuse.context import Options
    from vfuse.entry.calibrate import calibrate
    from vfuse.targets.cpu import machine_isa

    if machine_isa().tier.value not in ("avx2", "avx512"):
        pytest.skip("no AVX2 on this CPU")
    kernels = Options.from_env().cache_dir
    cal, bad, path = calibrate("avx2", tmp_path, reps=2, kernel_cache=kernels, ops=("exp", "gelu"))
    assert path == tmp_path / cal_mod.CALIBRATION_FILE
    # What a loaded machine can spoil: the GEMM fit too (twice in session 26, with a second job on both cores).
    assert set(bad) <= {"launch_s", "dram_bw", "serial_launch_s", "peak_f32"}
    assert cal.l2_bw > 1e9 and cal.peak_f32 > 1e9 and cal.vector_f32 > cal.transcendental_f32 > 1e8
    if "peak_f32" not in bad:  # else the torch-measured estimate stands in for the template's rate
        assert 0.2 < cal.library_f32 / cal.peak_f32 < 5  # torch.mm timed beside the template
    assert cal.library_attention_f32 > 1e9 and cal.attention_f32 > 1e9  # torch's SDPA beside the template
    assert [op for op, _ in cal.op_rates] == ["exp", "gelu"]
    assert cal_mod.read(tmp_path, detect().fingerprint(), "avx2") == cal
    assert cal_mod.read(tmp_path, detect().fingerprint(), "avx512") is None
    t = get_target("cpu", tmp_path, isa="avx2", calibrated=True)
    assert t.simd_lanes == 8 and t.l2_bw == pytest.approx(cal.l2_bw * t.cores)
    assert t.library_f32 == pytest.approx(cal.library_f32 * t.cores)


def test_cli_calibrate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import vfuse.entry.calibrate as entry
    from vfuse import cli

    seen = []

    def fake(isa: str, cache_dir: Path, reps: int) -> tuple[Calibration, list[str], Path]:
        seen.append((isa, reps))
        return dataclasses.replace(CAL, op_rates=(("exp", 3e10),)), ["launch_s"], cache_dir / "calibration_cpu.json"

    monkeypatch.setattr(entry, "calibrate", fake)
    assert cli.main(["calibrate", "--isa", "avx2", "--reps", "3"]) == 0
    out = capsys.readouterr().out
    assert seen == [("avx2", 3)] and "l2_bw              9.6e+10" in out and "op_rates.exp       3e+10" in out
    assert "launch_s           implausible" in out
    assert cli.main(["calibrate", "--reps", "0"]) == 2


def test_transcendental_ops_take_the_calibrated_rate() -> None:
    from vfuse.fusion.cost import estimate
    from vfuse.ir import DType, GraphBuilder, Op, TensorType

    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((1 << 16,), DType.F32))
    e = b.add(Op.EXP, [x], name="e")
    n = b.add(Op.NEG, [x], name="n")
    graph = b.build([e, n])
    t = apply(BASE, CAL)
    exp, neg = estimate(["e"], graph, t), estimate(["n"], graph, t)
    assert exp.compute_s == pytest.approx(exp.flops / t.transcendental_f32)
    assert neg.compute_s == pytest.approx(neg.flops / t.vector_f32)
    plain = estimate(["e"], graph, BASE)
    assert plain.compute_s == pytest.approx(plain.flops / BASE.vector_f32)  # uncalibrated: one rate


def test_planner_summaries_price_transcendental_ops_as_the_exact_model() -> None:
    """The planner scores merges from per-kernel summaries; on a calibrated target they must weigh
    exp as the exact cost does, or merges would be scored on other times than the plan reports."""
    from vfuse.fusion import summary as sm
    from vfuse.fusion.cost import estimate, time_weight
    from vfuse.ir import DType, GraphBuilder, Op, TensorType

    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((300, 257), DType.F32))
    e = b.add(Op.EXP, [x], name="e")
    n = b.add(Op.TANH, [b.add(Op.NEG, [e], name="n0")], name="n")
    graph = b.build([n])
    t = apply(BASE, dataclasses.replace(CAL, chain_weight=0.3))
    facts = {v.name: sm.node_facts(v, graph, t) for v in graph.nodes}
    pe, pn, ce = (sm.leaf(facts[v], graph[v], frozenset((v,)), facts) for v in ("e", "n0", "n"))
    first = sm.combine(pe, pn, frozenset(("n0",)), facts)
    merged = sm.combine(first, ce, frozenset(("n",)), facts)
    assert merged.transcendental == 2
    form = sm.form_of(merged, first, ce, facts)
    nbytes = {v.name: v.type.nbytes for v in graph.nodes}
    cost, _ = sm.summary_cost(merged, form, nbytes, t)
    exact = estimate(["e", "n0", "n"], graph, t)
    assert cost.time_s == pytest.approx(exact.time_s) and cost.compute_s == pytest.approx(exact.compute_s)
    alone = sum(estimate([v], graph, t).compute_s for v in ("e", "n0", "n"))
    assert exact.compute_s == pytest.approx(alone * 1.3)  # two transcendental ops: one past the first
    assert time_weight(graph["e"], graph, t) == pytest.approx(t.vector_f32 / t.transcendental_f32)
    assert time_weight(graph["n0"], graph, t) == time_weight(graph["e"], graph, BASE) == 1.0
    own = dataclasses.replace(t, op_rates=(("exp", 40e9),))  # exp timed alone: its own rate
    assert time_weight(graph["e"], graph, own) == pytest.approx(t.vector_f32 / 40e9)


def test_chain_weight_from_the_chain_and_its_ops_alone() -> None:
    from vfuse.entry.calibrate import chain_weight, ir_flops

    chain = [(op, ir_flops(op)) for op in ("exp", "gelu")]
    rates = {"exp": 20e9, "gelu": 40e9}
    alone_rate = (8 + 14) / (8 / 20e9 + 14 / 40e9)
    assert chain_weight(chain, alone_rate, rates) == pytest.approx(0.0)
    assert chain_weight(chain, alone_rate / 1.5, rates) == pytest.approx(0.5)  # 1.5x slower: 0.5 for one more op
    assert chain_weight(chain, alone_rate * 2, rates) == 0.0  # faster chained: no negative weight
    assert chain_weight(chain, alone_rate, {"exp": 20e9}) == 0.0  # an op without its own rate


def test_attention_tasks_cost_a_fixed_time_and_causal_masks_skip_blocks() -> None:
    from vfuse.fusion.cost import estimate
    from vfuse.ir import DType, GraphBuilder, Op, TensorType

    def attention(heads: int, keys: int, causal: bool) -> float:
        b = GraphBuilder()
        q, k, v = (
            b.add(Op.INPUT, name=n, index=i, type=TensorType((2, heads, keys, 64), DType.F32))
            for i, n in enumerate("qkv")
        )
        out = b.add(Op.SDPA, [q, k, v], name="o", scale=None, causal=causal, gqa=False)
        graph = b.build([out])
        return estimate(["o"], graph, t).compute_s - estimate(["o"], graph, plain).compute_s

    plain = apply(BASE, CAL)
    t = dataclasses.replace(plain, attention_task_s=4e-6)
    assert attention(8, 16, False) == pytest.approx(2 * 8 * 4e-6 / t.max_threads)  # 16 (batch, head) tasks
    assert attention(8, 16, True) == pytest.approx(attention(8, 16, False))  # one block: nothing skipped
    b = GraphBuilder()
    q, k, v = (
        b.add(Op.INPUT, name=n, index=i, type=TensorType((1, 1, 512, 64), DType.F32)) for i, n in enumerate("qkv")
    )
    causal = b.build([b.add(Op.SDPA, [q, k, v], name="o", scale=None, causal=True, gqa=False)])
    full = estimate(["o"], causal, plain)
    assert estimate(["o"], causal, t).compute_s == pytest.approx(1 * 4e-6 / 2 + full.compute_s * (0.5 + 32 / 512))


def test_attention_runs_at_its_own_calibrated_rate() -> None:
    """`Target.attention_f32`: attention's flops at the template's own rate (at AVX2 ~0.8 of the GEMM
    peak on a Zen 4: 2 heads of 512 x 64 were predicted 0.4-0.5x of their time), fitted with the task
    cost from two shapes."""
    from vfuse.entry.calibrate import attention_fit
    from vfuse.fusion.cost import estimate
    from vfuse.ir import DType, GraphBuilder, Op, TensorType

    b = GraphBuilder()
    q, k, v = (
        b.add(Op.INPUT, name=n, index=i, type=TensorType((1, 2, 512, 64), DType.F32)) for i, n in enumerate("qkv")
    )
    graph = b.build([b.add(Op.SDPA, [q, k, v], name="o", scale=None, causal=False, gqa=False)])
    t = dataclasses.replace(apply(BASE, CAL), attention_task_s=2e-6)
    slow = apply(BASE, dataclasses.replace(CAL, attention_task_s=2e-6, attention_f32=0.8 * CAL.peak_f32))
    assert slow.attention_f32 == pytest.approx(0.8 * t.peak_f32)
    at = estimate(["o"], graph, t)
    assert estimate(["o"], graph, slow).compute_s - at.compute_s == pytest.approx(at.flops / t.peak_f32 / 0.8 * 0.2)
    assert at_threads(slow, 1).attention_f32 == pytest.approx(slow.attention_f32 / 2)
    assert estimate(["o"], graph, dataclasses.replace(slow, attention_f32=0.0)).compute_s == at.compute_s
    task, rate = attention_fit((8, 10**6, 8 * 2e-6 + 1e-5), (2, 10**8, 2 * 2e-6 + 1e-3), 2e11)
    assert task == pytest.approx(2e-6) and rate == pytest.approx(1e11)
    assert attention_fit((8, 10**6, 1e-4), (2, 10**8, 1e-5), 2e11)[1] == 2e11  # a faster large run: the peak
