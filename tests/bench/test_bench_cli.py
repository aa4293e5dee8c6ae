"""End-to-end tests of `vfuse bench`: quick runs, the JSON schema, failure marking, --no-mmap."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from vfuse.bench import command, compile_times, contenders, main, render
from vfuse.bench.contenders import Compiled, Contender
from vfuse.bench.results import SCHEMA, BenchReport, CompileTime

# One thread: on a loaded CI box every 2-thread OpenMP region can wait a whole time slice.
_FAST = ["--quick", "--threads", "1", "--reps", "3", "--warmup", "1", "--min-sample-ms", "0.2"]
_CONTENDER_KEYS = {
    "name", "status", "error", "check", "first_call_s", "time", "gbps", "pct_copy",
    "speedup_vs_eager", "speedup_vs_inductor", "backend_stats",
}  # fmt: skip


def _run(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "bench.json"
    code = main([*_FAST, *argv, "--json", str(out)])
    return code, json.loads(out.read_text())


def _contender(report: dict[str, Any], workload: str, name: str, run: int = 0) -> dict[str, Any]:
    wl = next(w for w in report["runs"][run]["workloads"] if w["name"] == workload)
    return next(c for c in wl["contenders"] if c["name"] == name)


def _with_contender(monkeypatch: pytest.MonkeyPatch, name: str, prepare: Callable[[nn.Module], Compiled]) -> None:
    extra = Contender(name, "test double", prepare)
    monkeypatch.setattr(contenders, "CONTENDERS", MappingProxyType({**contenders.CONTENDERS, name: extra}))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick run of eager, dynamo and vfuse on two workloads, with the PNG where matplotlib is
    installed, shared by the tests that read it (one run instead of three)."""
    tmp = tmp_path_factory.mktemp("quick_run")
    png = tmp / "bench.png"
    threads_before = torch.get_num_threads()
    wanted = ["--workloads", "chain,tiny_graph", "--contenders", "eager,dynamo,vfuse"]
    has_png = importlib.util.find_spec("matplotlib") is not None
    code, report = _run(tmp, *wanted, *(("--png", str(png)) if has_png else ()))
    return {"code": code, "report": report, "threads": (threads_before, torch.get_num_threads()), "png": png}


def test_quick_run_writes_schema_and_checks_pass(quick_run: dict[str, Any]) -> None:
    # dynamo goes through torch.compile like vfuse and Inductor, but compiles in milliseconds.
    code, report = quick_run["code"], quick_run["report"]
    assert code == 0 and report["ok"] is True
    threads_before, threads_after = quick_run["threads"]
    assert threads_after == threads_before  # --threads must not leak out of main()
    assert report["schema"] == "vfuse-bench/1"
    assert report["config"]["workloads"] == ["chain", "tiny_graph"]
    machine = report["runs"][0]["machine"]
    assert machine["threads"] == 1 and machine["torch_version"] == torch.__version__
    assert machine["cpu_model"] and machine["date_utc"]
    for workload in report["runs"][0]["workloads"]:
        assert workload["minimal_bytes"] > 0
        assert workload["copy"]["prealloc_gbps"] > 0 and workload["copy"]["fresh_gbps"] > 0
        assert [c["name"] for c in workload["contenders"]] == ["eager", "dynamo", "vfuse"]
        for c in workload["contenders"]:
            assert set(c) == _CONTENDER_KEYS
            assert c["status"] == "ok" and c["check"]["ok"] is True and c["check"]["kind"] == "float"
            assert len(c["time"]["samples_s"]) == 3 and c["time"]["median_s"] > 0
            assert c["gbps"] > 0 and c["pct_copy"] > 0
    assert _contender(report, "chain", "eager")["speedup_vs_eager"] == pytest.approx(1.0)
    assert _contender(report, "chain", "dynamo")["speedup_vs_inductor"] is None


def test_vfuse_matches_eager_on_quick_workloads(quick_run: dict[str, Any]) -> None:
    code, report = quick_run["code"], quick_run["report"]
    for workload in ("chain", "tiny_graph"):
        result = _contender(report, workload, "vfuse")
        assert result["status"] == "ok", result["error"] or result["check"]
        assert result["backend_stats"]["graphs"] >= 1 and result["backend_stats"]["eager_graphs"] == 0
    assert code == 0


def test_mismatch_and_error_are_marked_and_fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(module: nn.Module) -> Compiled:
        return Compiled(lambda *xs: module(*xs) + 1e-2)

    def broken(module: nn.Module) -> Compiled:
        raise RuntimeError("no backend here")

    def drifting(module: nn.Module) -> Compiled:
        calls = [0]

        def fn(*xs: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return module(*xs) * (1.0 if calls[0] == 1 else 2.0)  # right once, then wrong

        return Compiled(fn)

    _with_contender(monkeypatch, "wrong", wrong)
    _with_contender(monkeypatch, "broken", broken)
    _with_contender(monkeypatch, "drifting", drifting)
    code, report = _run(tmp_path, "--workloads", "tiny_graph", "--contenders", "eager,wrong,broken,drifting")
    assert code == 1 and report["ok"] is False
    wrong_result = _contender(report, "tiny_graph", "wrong")
    assert wrong_result["status"] == "mismatch" and wrong_result["check"]["max_abs_err"] == pytest.approx(
        1e-2, rel=1e-4
    )
    assert wrong_result["time"] is not None  # a mismatch is still timed, and marked
    broken_result = _contender(report, "tiny_graph", "broken")
    assert broken_result["status"] == "error" and "no backend here" in broken_result["error"]
    drifting_result = _contender(report, "tiny_graph", "drifting")
    assert drifting_result["status"] == "mismatch" and "after timing" in drifting_result["check"]["detail"]
    assert _contender(report, "tiny_graph", "eager")["status"] == "ok"


def test_no_mmap_reruns_in_a_child_with_glibc_tunables(tmp_path: Path) -> None:
    code, report = _run(tmp_path, "--workloads", "tiny_graph", "--contenders", "eager", "--no-mmap")
    assert code == 0
    assert [r["label"] for r in report["runs"]] == [command.DEFAULT_LABEL, command.NO_MMAP_LABEL]
    parent, child = (r["machine"]["glibc_tunables"] or "" for r in report["runs"])
    assert "mmap_max=0" not in parent
    assert "glibc.malloc.mmap_max=0" in child and "trim_threshold" in child
    assert report["runs"][1]["workloads"][0]["contenders"][0]["check"]["ok"] is True


def test_a_failed_no_mmap_child_keeps_the_parent_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[dict[str, str]] = []

    def child_that_writes_nothing(cmd: list[str], env: dict[str, str], check: bool) -> None:
        spawned.append(env)

    monkeypatch.setattr(command.subprocess, "run", child_that_writes_nothing)
    code, report = _run(tmp_path, "--workloads", "tiny_graph", "--contenders", "eager", "--no-mmap")
    assert code == 1 and report["ok"] is False
    assert spawned and spawned[0]["GLIBC_TUNABLES"].startswith("glibc.malloc.mmap_max=0")
    assert len(report["runs"]) == 1 and report["runs"][0]["ok"] is True
    assert "no usable results" in report["errors"][0]


def test_png_is_written(quick_run: dict[str, Any]) -> None:
    pytest.importorskip("matplotlib")
    assert quick_run["code"] == 0 and quick_run["png"].read_bytes()[:4] == b"\x89PNG"


def test_compile_time_children_share_fresh_cache_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, str], bool]] = []

    def fake_child(argv: list[str], env: dict[str, str]) -> dict[str, float]:
        cache = Path(env["VFUSE_CACHE_DIR"]).parent
        seen.append((argv, env, any(p.is_file() for p in cache.rglob("*"))))
        (cache / "marker").write_text("populated by the cold run")
        first, backend = [(2.0, 1.5), (0.5, 0.2), (0.3, 0.05)][len(seen) - 1]
        return {"first_call_s": first, "backend_s": backend, "gc_s": 0.01 * len(seen), "steady_call_s": 0.1}

    monkeypatch.setattr(compile_times, "_run_child", fake_child)
    result = compile_times.measure_compile_time("vfuse", "ln_gelu", quick=True, threads=1)
    (cold_argv, cold_env, cold_populated), (warm_argv, warm_env, warm_populated), (proc_argv, proc_env, _) = seen
    assert cold_argv[:2] == ["vfuse", "ln_gelu"] and "--quick" in cold_argv
    assert not cold_populated and warm_populated  # cold starts empty, warm reuses the same dirs
    for key in ("VFUSE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):  # TMPDIR: Inductor's header
        assert cold_env[key] == warm_env[key] == proc_env[key]
        assert Path(cold_env[key]).parent == Path(cold_env["VFUSE_CACHE_DIR"]).parent
    # cold compiles the other function after its measurement, so the warm-process probe,
    # which compiles it before the clock, finds it cached too
    assert cold_argv[-2:] == ["--other", "after"] and "--other" not in warm_argv
    assert proc_argv[-2:] == ["--other", "before"]
    assert result.cold_compile_s == pytest.approx(1.9) and result.warm_compile_s == pytest.approx(0.4)
    assert result.warm_process_compile_s == pytest.approx(0.2)
    assert (result.cold_backend_s, result.warm_backend_s, result.warm_process_backend_s) == (1.5, 0.2, 0.05)
    assert (result.cold_gc_s, result.warm_gc_s, result.warm_process_gc_s) == (0.01, 0.02, 0.03)


def test_compile_time_probe_prints_first_and_steady_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_times.main(["dynamo", "tiny_graph", "--quick", "--threads", "1"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["first_call_s"] > 0 and figures["steady_call_s"] > 0
    assert figures["backend_s"] is None and figures["gc_s"] >= 0  # backend="eager": nothing to time


def test_compile_time_probe_times_the_vfuse_backend(capsys: pytest.CaptureFixture[str]) -> None:
    from vfuse.entry.capture import VfuseBackend

    entry = VfuseBackend.__call__
    assert compile_times.main(["vfuse", "tiny_graph", "--quick", "--threads", "1", "--other", "before"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Only the measured graph's compile: it lies inside the first call, and the other
    # function compiled before it is not counted.
    assert 0 < figures["backend_s"] < figures["first_call_s"]
    assert VfuseBackend.__call__ is entry  # the probe put the backend back


def test_compile_times_table_names_every_figure() -> None:
    row = CompileTime("vfuse", "ln_gelu", 1.0, 0.3, 0.01, None, 0.1, 0.9, 0.05, 0.02, 0.05, 0.2, None)
    console = Console(width=300, record=True)
    console.print(render.compile_times_table((row,)))
    text = console.export_text()
    for header in ("cold", "warm", "2nd graph", "1st call", "in backend", "steady"):
        assert header in text
    # 1st call figures are first call minus steady call; gc shown where it is 10 % of it or more
    assert "990 ms" in text and "290 ms (gc 200 ms)" in text and "90 ms" in text and "50 ms" in text
    assert "gc 50" not in text
    data = BenchReport(SCHEMA, {}, (), (row,), True).to_json_dict()["compile_times"][0]
    assert data["warm_process_compile_s"] == pytest.approx(0.09) and data["warm_backend_s"] == 0.05


def test_usage_errors_return_2_and_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workloads", "nope"]) == 2
    assert main(["--contenders", "eager,nope"]) == 2
    assert main(["--help"]) == 0
    assert "--no-mmap" in capsys.readouterr().out


def test_compile_time_probes_preimport_the_same_torch_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-time torch imports before the clock are the same for every contender (Inductor's
    compile_fx included), so none of them is timed for one contender only."""
    imported: dict[str, list[str]] = {}
    for contender in ("vfuse", "inductor", "dynamo"):
        names: list[str] = []
        monkeypatch.setattr(compile_times.importlib, "import_module", names.append)
        compile_times._preimport(contender)
        imported[contender] = [n for n in names if n.startswith("torch")]
    assert imported["vfuse"] == imported["inductor"] == imported["dynamo"]
    assert "torch._inductor.compile_fx" in imported["vfuse"]
