"""`vfuse bench --train --quick`: the JSON's fields, losses and gradients checked against eager,
and the peak-memory probe against allocations of known size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vfuse.bench import train
from vfuse.bench.command import main


def test_step_peak_bytes_counts_live_allocations() -> None:
    def step() -> None:
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(3 << 20, dtype=torch.uint8)
        del a
        c = torch.empty(1 << 19, dtype=torch.uint8)
        del b, c

    peak = train.step_peak_bytes(step)
    assert (4 << 20) <= peak < (4 << 20) + 4096, peak  # a and b live together; c came after a was freed


def test_train_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    argv = ["--train", "--quick", "--workloads", "ln_gelu_mlp,conv_bn_relu", "--contenders", "eager,vfuse"]
    assert main([*argv, "--reps", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "vfuse-bench-train/1" and doc["ok"] is True
    rows = {(r["workload"], r["contender"]): r for r in doc["results"]}
    assert set(rows) == {(w, c) for w in ("ln_gelu_mlp", "conv_bn_relu") for c in ("eager", "vfuse")}
    for (_, contender), r in rows.items():
        assert r["ok"] and not r["error"], r
        assert r["step_ms"] > 0 and r["peak_bytes"] == r["step_peak_bytes"] + r["retained_bytes"] > 0, r
        assert r["loss_rel_err"] <= train.LOSS_RTOL and r["grad_rel_err"] <= train.GRAD_RTOL, r
        if contender == "vfuse":
            assert r["eager_graphs"] == 0 and r["graphs"] >= 3 and r["saved_bytes"] > 0, r  # fwd, bwd, optimizer
    assert rows[("ln_gelu_mlp", "eager")]["state_bytes"] == rows[("ln_gelu_mlp", "vfuse")]["state_bytes"]


def test_train_rejects_unknown_workload() -> None:
    assert main(["--train", "--quick", "--workloads", "no_such_thing"]) == 2


def test_train_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--train", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in (*train.WORKLOADS, "hf_gpt2"))
