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


def test_step_peak_bytes_ignores_frees_of_earlier_blocks() -> None:
    """A block allocated under an earlier profile and freed in this step subtracts nothing: only
    the step's own blocks count (torch reports such a free with the size it noted back then)."""
    held: list[torch.Tensor] = []
    train.step_peak_bytes(lambda: held.append(torch.empty(4 << 20, dtype=torch.uint8)))

    def step() -> None:
        held.clear()  # 4 MiB freed before anything is allocated
        a = torch.empty(1 << 20, dtype=torch.uint8)
        del a

    peak = train.step_peak_bytes(step)
    assert (1 << 20) <= peak < (1 << 20) + 4096, peak


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
        assert (
            r["step_ms"] > 0
            and r["peak_bytes"] == r["step_peak_bytes"] + r["retained_bytes"] + r["pooled_grad_bytes"] > 0
        ), r
        assert r["loss_rel_err"] <= train.LOSS_RTOL and r["grad_rel_err"] <= train.GRAD_RTOL, r
        # Every gradient is live at once when the backward ends, whoever allocated it and when.
        assert r["peak_bytes"] >= r["state_bytes"] // 4, r  # AdamW: weights, grads, two moments
        if contender == "vfuse":
            assert r["eager_graphs"] == 0 and r["graphs"] >= 3 and r["saved_bytes"] > 0, r  # fwd, bwd, optimizer
    assert rows[("ln_gelu_mlp", "eager")]["state_bytes"] == rows[("ln_gelu_mlp", "vfuse")]["state_bytes"]


def test_train_rejects_unknown_workload() -> None:
    assert main(["--train", "--quick", "--workloads", "no_such_thing"]) == 2


def test_train_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--train", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in (*train.WORKLOADS, "hf_gpt2"))


def _tiny(quick: bool) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    return torch.nn.Linear(7, 5), (torch.randn(3, 7, generator=gen),)


def test_train_steps_are_interleaved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every contender is built and checked before any is timed; the timed steps alternate between
    contenders (one each per round); a contender that fails while timed is an error row, the others
    keep their figures. Eager's trainer stands in for every contender, so the test is fast."""
    log: list[str] = []
    make = train._trainer

    def trainer(model: torch.nn.Module, inputs: tuple, contender: str, strict: bool) -> train._Trainer:
        tr = make(model, inputs, "eager", strict)
        step, calls = tr.step, [0]

        def logged() -> torch.Tensor:
            log.append(contender)
            calls[0] += 1
            if contender == "vfuse" and calls[0] > 4:  # fails in the timed rounds
                raise RuntimeError("boom")
            return step()

        tr.step = logged  # type: ignore[method-assign]
        return tr

    monkeypatch.setattr(train, "_trainer", trainer)
    monkeypatch.setitem(train.WORKLOADS, "tiny", ("a 7x5 linear layer", _tiny))
    out, reps = tmp_path / "train.json", 6
    argv = ["--train", "--quick", "--workloads", "tiny", "--contenders", "eager,inductor,vfuse"]
    assert main([*argv, "--reps", str(reps), "--warmup", "1", "--json", str(out)]) == 1  # vfuse's row failed
    assert log[:3] == ["eager", "inductor", "vfuse"]  # built and checked first, in order
    rounds = [c for c in log[3:] if c != "vfuse"][-2 * reps - 2 : -2]  # the timed rounds, then the two profiled
    pairs = [tuple(rounds[i : i + 2]) for i in range(0, len(rounds), 2)]
    assert set(pairs) == {("eager", "inductor"), ("inductor", "eager")}, rounds  # one step each per round, rotated
    assert log.index("eager", 3) < log.index("vfuse", 3) and log.count("vfuse") == 5
    rows = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["vfuse"]["error"] == "RuntimeError: boom" and not rows["vfuse"]["ok"]
    for r in (rows["eager"], rows["inductor"]):
        assert r["ok"] and r["step_ms_q1"] <= r["step_ms"] <= r["step_ms_q3"] and r["step_peak_bytes"] > 0, r
