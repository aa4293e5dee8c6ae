"""`vfuse bench --dynamic --smoke`: the JSON's structure, every output against eager, and the
pieces (resized inputs, the bars) on known values."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vfuse.bench import dynamic, dynamic_models
from vfuse.bench.command import main


def test_dynamic_smoke_json(tmp_path: Path) -> None:
    out = tmp_path / "dynamic.json"
    argv = ["--dynamic", "--smoke", "--models", "hf_gpt2", "--workloads", "chain", "--threads", "2"]
    rc = main([*argv, "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["ok"] is True, (doc["models"], doc["steady"])
    assert doc["schema"] == dynamic.SCHEMA
    assert doc["config"]["threads"] == 2 == doc["machine"]["threads"]
    rows = {(r["model"], r["contender"], r["mode"]): r for r in doc["models"]}
    assert set(rows) == {("hf_gpt2", c, "dynamic") for c in ("vfuse", "inductor")}
    lengths, new_length = dynamic_models.lengths(quick=True)
    for r in rows.values():
        assert not r.get("error") and r["cache"] == "in-process" and r["eager_graphs"] == 0, r
        assert [c["length"] for c in r["calls"]] == list(lengths) and r["new_size"]["length"] == new_length
        assert all(c["ok"] and c["max_abs_err"] < 1e-3 for c in [*r["calls"], r["new_size"]]), r
        assert 1 <= r["dynamo_graphs"] <= r["graphs"] <= len(lengths), r
        assert r["calls"][0]["graphs_so_far"] >= 1 and r["calls"][-1]["graphs_so_far"] == r["graphs"], r
        assert r["compile_s"] > 0 and all(c["steady_s"] > 0 for c in r["calls"]), r
    steady = {r["contender"]: r for r in doc["steady"]}
    assert set(steady) == {"vfuse", "inductor", "dynamo"}  # dynamo: capture alone, its own dynamic cost
    for r in steady.values():
        assert r["ok"] and not r["error"] and r["workload"] == "chain", r
        assert r["static_graphs"] == 1 and r["dynamic_graphs"] >= 1, r  # the hint's graph serves the timed size
        assert r["static_s"] > 0 and r["ratio"] == r["dynamic_s"] / r["static_s"], r
        assert r["shape"] == [1 << 16] and r["hint_shape"] == [49153] and r["new_shape"] == [40961], r
        assert max(r["static_max_abs_err"], r["dynamic_max_abs_err"], r["new_max_abs_err"]) < 1e-5, r
    assert steady["vfuse"]["dynamic_graphs"] == 1 and steady["vfuse"]["new_graphs"] == 0  # one program, any size
    (bar,) = doc["bars"]["models"]
    assert bar["graphs"] == [
        rows["hf_gpt2", "vfuse", "dynamic"]["graphs"],
        rows["hf_gpt2", "inductor", "dynamic"]["graphs"],
    ]
    (steady_bar,) = doc["bars"]["steady"]
    assert steady_bar["workload"] == "chain"
    assert steady_bar["capture_extra_s"] == steady["dynamo"]["dynamic_s"] - steady["dynamo"]["static_s"]


def test_resized_inputs_are_odd_sized_copies() -> None:
    x, y = torch.randn(8, 6), torch.randn(6, 8)
    (a,) = dynamic.resized("chain", (x,), 3 / 4)
    assert a.shape == (7, 6) and a._base is None and torch.equal(a, x[:7])  # a view would make Dynamo recompile
    b, c = dynamic.resized("transpose_add", (y, x), 5 / 8)  # x.t() + y: the varied dims match
    assert b.shape == (6, 6) and c.shape == (6, 6) and b.is_contiguous() and torch.equal(b, y[:, :6])


def _model_row(contender: str, cache: str, graphs: int, compile_s: float) -> dict:
    new = {"extra_s": 2e-3 if contender == "vfuse" else 0.0, "ok": True}
    return {"model": "m", "mode": "dynamic", "contender": contender, "cache": cache, "graphs": graphs,
            "compile_s": compile_s, "new_size": new, "calls": []}  # fmt: skip


def test_bars_compare_vfuse_with_inductor() -> None:
    rows = [_model_row("vfuse", "warm", 5, 2.0), _model_row("inductor", "warm", 1, 4.0)]
    rows += [_model_row("vfuse", "cold", 1, 2.0), _model_row("inductor", "cold", 1, 4.0)]
    warm, cold = dynamic.bars(rows, [])["models"]
    assert (warm["cache"], warm["graphs"], warm["graphs_ok"], warm["compile_ratio"]) == ("warm", [5, 1], False, 0.5)
    assert warm["compile_ok"] and not warm["new_size_ok"]  # warm: <= 1x Inductor; 2 ms over the 1 ms bar
    assert cold["graphs_ok"] and not cold["compile_ok"]  # cold: 0.5x is over the 1/3 bar


def test_dynamic_bad_usage() -> None:
    assert main(["--dynamic", "--smoke", "--models", "hf_resnet"]) == 2  # no sequence length to vary
    # dynamo is only the steady part's yardstick: a run needs a compiler
    assert main(["--dynamic", "--smoke", "--contenders", "eager,dynamo"]) == 2
    assert main(["--dynamic", "--smoke", "--contenders", "vfuse,no_such"]) == 2
    assert main(["--dynamic", "--smoke", "--workloads", "no_such_thing"]) == 2
