"""Unit tests of the benchmark harness pieces: checks, timing, workloads, registries."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vfuse.bench import contenders, workloads
from vfuse.bench.checks import compare
from vfuse.bench.render import run_table
from vfuse.bench.results import MachineInfo, RunResult
from vfuse.bench.timing import Stats, TimingConfig, copy_callables, measure
from vfuse.targets.cpu import machine_isa


def test_float_check_tolerance_and_max_error() -> None:
    x = torch.linspace(-1, 1, 100)
    assert compare(x, x + 5e-6).ok
    bad = compare(x, x + 1e-3)
    assert not bad.ok and bad.kind == "float"
    assert bad.max_abs_err == pytest.approx(1e-3, rel=1e-3)


def test_int_check_allows_one_step_only() -> None:
    q = torch.tensor([-128, 0, 5, 127], dtype=torch.int8)
    assert compare(q, q.clone()).ok
    assert compare(q, torch.tensor([-127, 0, 5, 127], dtype=torch.int8)).ok
    two = compare(q, torch.tensor([-126, 0, 5, 127], dtype=torch.int8))
    assert not two.ok and two.kind == "int" and two.max_abs_err == 2


def test_check_rejects_wrong_shape_dtype_and_arity() -> None:
    x = torch.zeros(4)
    assert not compare(x, torch.zeros(5)).ok
    assert not compare(x, torch.zeros(4, dtype=torch.float64)).ok
    assert not compare((x, x), (x,)).ok
    assert not compare(x, torch.full((4,), float("nan"))).ok


def test_measure_interleaves_and_summarizes() -> None:
    calls: list[str] = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    stats = measure(fns, TimingConfig(warmup=1, reps=4, min_sample_s=0.0))
    assert set(stats) == {"a", "b"}
    assert all(len(s.samples_s) == 4 and s.inner_loops == 1 for s in stats.values())
    # warmup (a, b), calibration (a, b), then rounds rotate which contender goes first
    assert calls[4:] == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_stats_quartiles() -> None:
    s = Stats.from_samples([5.0, 1.0, 3.0, 2.0, 4.0], inner_loops=1)
    assert (s.median_s, s.q1_s, s.q3_s, s.min_s, s.iqr_s) == (3.0, 2.0, 4.0, 1.0, 2.0)
    assert Stats.from_dict({**s.__dict__}) == s


def test_copy_callables_move_the_requested_traffic() -> None:
    fns, traffic = copy_callables(8 * 1024)
    assert traffic == 8 * 1024
    assert torch.equal(fns["copy"](), fns["copy_fresh"]())


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_every_workload_builds_and_runs_quick(name: str) -> None:
    instance = workloads.WORKLOADS[name].build(True)
    with torch.no_grad():
        out = instance.module(*instance.inputs)
    assert workloads.minimal_bytes(instance, out) >= sum(t.nbytes for t in instance.inputs) + out.nbytes
    assert torch.isfinite(out.float()).all()


def test_minimal_bytes_counts_inputs_params_and_outputs() -> None:
    chain = workloads.WORKLOADS["chain"].build(True)
    n = chain.inputs[0].numel()
    assert workloads.minimal_bytes(chain, chain.module(*chain.inputs)) == 3 * 4 * n
    ln = workloads.WORKLOADS["ln_gelu"].build(True)
    rows, cols = ln.inputs[0].shape
    assert workloads.minimal_bytes(ln, ln.module(*ln.inputs)) == 4 * (2 * rows * cols + 2 * cols)


def test_full_sizes_follow_the_issue() -> None:
    # Sizes only, without allocating 512 MB: quick keeps the row length, full has 8192 rows.
    assert workloads._ROWS_FULL == 8192
    dq = workloads.WORKLOADS["dequant_quant"].build(True)
    assert dq.inputs[0].dtype == torch.int8 and dq.inputs[0].shape[1] == 4096
    assert dq.module(*dq.inputs).dtype == torch.int8


def test_dequant_quant_rounds_half_to_even() -> None:
    module = workloads.DequantGeluQuant(in_scale=1.0, in_zero=0, out_scale=1.0, out_zero=0)
    # gelu(x) ~= x for large x, so 100 stays 100 and the clamp holds 127 at the top.
    out = module(torch.tensor([100, 127, -128], dtype=torch.int8))
    assert out.tolist() == [100, 127, 0]
    assert torch.round(torch.tensor([0.5, 1.5, 2.5])).tolist() == [0.0, 2.0, 2.0]


def test_tiny_graph_has_fifty_ops() -> None:
    gm = torch.fx.symbolic_trace(workloads.TinyGraph())
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(ops) == 50


def test_selection_keeps_eager_first_and_rejects_unknown() -> None:
    assert [c.name for c in contenders.select(["vfuse", "eager"])] == ["eager", "vfuse"]
    assert [c.name for c in contenders.select(["vfuse"])] == ["eager", "vfuse"]
    with pytest.raises(ValueError, match="nope"):
        contenders.select(["nope"])
    with pytest.raises(ValueError, match="nope"):
        workloads.select(["chain", "nope"])


def test_vfuse_is_strict_unless_fallback_is_allowed() -> None:
    strict = contenders.select(["vfuse"])[1]
    lenient = contenders.select(["vfuse"], allow_fallback=True)[1]
    assert strict.name == lenient.name == "vfuse"
    assert strict.prepare is contenders.CONTENDERS["vfuse"].prepare
    assert lenient.prepare is not strict.prepare


def test_machine_info_names_the_tier_vfuse_compiles_for(monkeypatch: pytest.MonkeyPatch) -> None:
    own = machine_isa().describe()
    monkeypatch.setenv("VFUSE_ISA", "generic")
    info = MachineInfo.probe()
    assert (info.isa, info.cpu_isa) == ("generic", own)
    assert MachineInfo.from_dict(dataclasses.asdict(info)) == info
    title = str(run_table(RunResult("t", info, ())).title)
    assert "vfuse code generic" in title and (own == "generic" or f"(CPU: {own})" in title)
    monkeypatch.delenv("VFUSE_ISA")
    assert MachineInfo.probe().isa == own
