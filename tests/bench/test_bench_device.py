"""`vfuse bench --device cpu --smoke`: the device benchmark's code path on the CPU (tiny sizes, vfuse in
Triton's interpreter, graph capture through the host replay driver, a host clock for CUDA events),
writing the same JSON as `--device cuda`; the time budget skips what is left and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vfuse.bench.command import main
from vfuse.bench.device import CONTENDERS, SCHEMA, WORKLOADS

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def test_smoke_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert (
        main(["--device", "cpu", "--smoke", "--workloads", "add_mul_relu_fp32,attention_causal", "--json", str(out)])
        == 0
    )
    r = json.loads(out.read_text())
    assert r["schema"] == SCHEMA and r["smoke"] is True and r["ok"] is True
    assert r["device"]["type"] == "cpu" and r["device"]["target"] == "h100" and r["device"]["triton"]
    assert r["copy"]["bytes"] == 2 << 20 and r["copy"]["gbps"] > 0
    assert [w["name"] for w in r["workloads"]] == ["add_mul_relu_fp32", "attention_causal"]
    for w in r["workloads"]:
        assert list(w["results"]) == list(CONTENDERS) and w["bytes"] > 0
        for name, res in w["results"].items():
            assert res["ok"] and not res["error"], (w["name"], name, res)
            assert 0 < res["min_us"] <= res["median_us"] and res["max_err"] is not None
            assert (res["pct_copy_bw"] is not None) == (w["family"] == "memory")
        # One kernel per workload: the cost model launches it rather than copy inputs for a replay.
        assert w["results"]["vfuse_graphs"]["cuda_graphs"].startswith("not captured (cost model): a replay")
        assert w["results"]["vfuse"]["cuda_graphs"] == ""  # CPU calls without graphs skip the runner
    o = r["overhead"]
    assert all(o[f"{n}_us"] > 0 for n in ("eager", "vfuse", "vfuse_graphs", "vfuse_graphs_static"))
    assert o["replay_saves_us"] == pytest.approx(o["vfuse_us"] - o["vfuse_graphs_us"])
    assert r["elapsed_s"] > 0


def test_budget_spent_skips_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--device", "cpu", "--smoke", "--budget-s", "0", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [w["name"] for w in r["workloads"]] == [w.name for w in WORKLOADS]
    assert {w.dtype for w in WORKLOADS if w.family == "memory"} == {"fp32", "bf16"}
    for w in r["workloads"]:
        assert all(res["error"] == "skipped: time budget spent" for res in w["results"].values())
    assert r["overhead"]["vfuse_graphs_error"] == "skipped: time budget spent"


def test_unknown_workload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--workloads", "nope"]) == 2
    assert "unknown device workload(s) nope" in capsys.readouterr().out
