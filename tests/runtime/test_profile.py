"""The per-kernel profiler (`g.profile`, runtime/profile.py): one row per kernel and torch step the
report lists, with the report's names, a real measured time, the cost model's prediction, and
the timing build computing what the normal build computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vfuse
from vfuse.errors import VfuseError, VfuseInputError
from vfuse.runtime.profile import run_timed, timing_executor


def _norm_gemm(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
    return torch.nn.functional.gelu(y @ m) + 1, torch.exp(x).sum(0)


def _with_torch_step(x: torch.Tensor) -> torch.Tensor:
    return torch.sort(torch.exp(x) * 2, dim=-1).values + 1  # sort runs through torch


def _inputs() -> tuple[torch.Tensor, ...]:
    return torch.randn(67, 131), torch.randn(131), torch.randn(131, 29)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of these tests' own: the shared one's measured target may be rewritten (another
    process remeasuring) between a compile and an explain whose predictions are compared."""
    return tmp_path_factory.mktemp("cache")


def test_rows_match_the_report_and_are_measured(cache: Path) -> None:
    xs = _inputs()
    g = vfuse.compile(_norm_gemm, xs, cache_dir=cache)
    rows = g.profile(*xs, reps=3)
    report = vfuse.explain(_norm_gemm, *xs, cache_dir=cache)
    assert [r.name for r in rows] == [k.name for k in report.kernels]
    assert [r.nodes for r in rows] == [k.nodes for k in report.kernels]
    assert len(rows) == g.stats.kernels
    assert {r.runs for r in rows} == {"native", "template"}
    for r, k in zip(rows, report.kernels):
        assert r.measured_s > 0
        assert r.predicted_s == pytest.approx(k.time_s)
        assert r.ratio == pytest.approx(r.predicted_s / r.measured_s)


def test_timing_build_computes_what_the_graph_computes() -> None:
    xs = _inputs()
    g = vfuse.compile(_norm_gemm, xs)
    timing, timed = timing_executor(g.compiled.executor)
    assert timing.program.profiled and "vf_seg0_prof" in timing.source
    assert "_prof" not in g.compiled.executor.source  # the normal build is unchanged
    times, outs = run_timed(timing, timed, list(xs))
    assert len(times) == len(g.compiled.executor.program.kernels)
    for got, want in zip(outs, _norm_gemm(*xs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_torch_steps_are_timed_too(isa: str) -> None:
    from vfuse.targets.cpu import machine_isa

    if isa == "avx2" and machine_isa().tier.value not in ("avx2", "avx512"):
        pytest.skip("no AVX2 on this CPU")
    x = torch.randn(64, 33)
    g = vfuse.compile(_with_torch_step, (x,), isa=isa)
    rows = g.profile(x, reps=2)
    assert [r.runs for r in rows] == ["native", "torch", "native"]
    assert rows[1].name == "torch1" and "sort" in rows[1].nodes
    assert all(r.measured_s > 0 for r in rows)
    assert [r.name for r in rows] == [k.name for k in vfuse.explain(_with_torch_step, x, isa=isa).kernels]


def test_profile_through_torch_compile_and_errors() -> None:
    x = torch.randn(40, 50)
    f = torch.compile(lambda t: torch.relu(t) * 3, backend="vfuse")
    f(x)
    g = vfuse.last_compiled()
    rows = g.profile(x, reps=1)
    assert len(rows) == 1 and rows[0].measured_s > 0
    with pytest.raises(ValueError, match="reps"):
        g.profile(x, reps=0)
    with pytest.raises(VfuseInputError, match="compiled for"):
        g.profile(torch.randn(3, 3))
    interp = vfuse.compile(lambda t: t + 1, (x,), backend="interp")
    with pytest.raises(VfuseError, match="natively compiled"):
        interp.profile(x)


SPEC = """
import torch

def factory():
    m = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.GELU(), torch.nn.LayerNorm(40))
    return m, (torch.randn(13, 48),)
"""


def test_cli_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vfuse import cli

    spec = tmp_path / "model.py"
    spec.write_text(SPEC)
    assert cli.main(["profile", f"{spec}:factory", "--reps", "2", "--json", "--html", str(tmp_path / "r.html")]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [k["name"] for k in data["kernels"]]
    assert names == ["k0_c", "k1"] and all(k["measured_s"] > 0 and k["ratio"] > 0 for k in data["kernels"])
    assert all(0 < k["best_s"] <= k["measured_s"] for k in data["kernels"])  # the fastest run beside the median
    assert 'class="measured"' in (tmp_path / "r.html").read_text()  # the report, with measured times
    assert cli.main(["profile", f"{spec}:factory", "--reps", "1", "--isa", "avx2", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "pred/meas" in table and "LayerNorm row kernel" in table and "total" in table and "best" in table
    assert cli.main(["profile", f"{spec}:factory", "--reps", "0"]) == 2
    assert "vfuse profile: error: --reps" in capsys.readouterr().err


def test_predictions_rank_generated_kernels() -> None:
    """The small version of benchmarks/cost_check.py: varied generated graphs (pointwise chains,
    broadcasts, row and column reductions, GEMM, conv, attention), every kernel profiled on one
    thread (least disturbed on a shared machine), ranked by the cost model as measured."""
    from benchmarks.cost_check import cases, spearman

    predicted, measured = [], []
    for case in cases(9, seed=3, max_log2=19):
        g = vfuse.compile(case.fn, case.inputs)
        rows = g.profile(*case.inputs, reps=3, threads=1)
        assert [r.name for r in rows if r.runs != "torch"] == [k.name for k in g.compiled.executor.program.kernels]
        assert all(r.measured_s > 0 and r.best_s > 0 and r.predicted_s for r in rows)
        predicted += [r.predicted_s for r in rows if r.runs != "torch"]
        measured += [r.best_s for r in rows if r.runs != "torch"]
    assert len(predicted) >= 9
    assert spearman(predicted, measured) >= 0.7, list(zip(predicted, measured))


def test_explain_profiled_on_one_thread_shows_one_thread_predictions(cache: Path) -> None:
    xs = _inputs()
    report = vfuse.explain(_norm_gemm, *xs, profile=1, profile_threads=1, cache_dir=cache)
    rows = vfuse.compile(_norm_gemm, xs, cache_dir=cache).profile(*xs, reps=1, threads=1)
    assert [k.time_s for k in report.kernels] == pytest.approx([r.predicted_s for r in rows])
    assert report.time_fused_s == pytest.approx(sum(r.predicted_s for r in rows))
    two = vfuse.explain(_norm_gemm, *xs, cache_dir=cache)  # unfused priced for one core too: like with like
    assert report.time_unfused_s > two.time_unfused_s
    assert all(k.measured_s for k in report.kernels)


def test_profiling_leaves_threads_and_random_state_alone() -> None:
    def dropout(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True) * 2

    x = torch.randn(300, 70)
    g = vfuse.compile(dropout, (x,))
    threads = torch.get_num_threads()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    rows = g.profile(x, reps=2, threads=1)
    assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == threads
    assert rows and all(r.measured_s > 0 for r in rows)
