"""The CUDA runtime's autotuning (runtime/triton.py `Tuning`): a device the executor tunes on
times every candidate of every contraction template on its first call, runs the fastest and
caches it; the interpreter never times. A fake timer stands in for `cuda_timer`, and "cpu" is
made a tuned device so that the chosen tiles run in the interpreter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

from vfuse.schedule.gpu import candidates
from vfuse.targets import get_target

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w)


INPUTS = (torch.randn(9, 70), torch.randn(70, 21))


def _executor(cache: Path, timer: Any) -> tuple[Any, Any]:
    compiled = compile_triton(_fn, INPUTS, cache_dir=cache)
    e = compiled.compiled.executor
    assert e.tuning is not None and e.tuning.preset == "h100"
    e.tuning = dataclasses.replace(e.tuning, timer=lambda folder: timer)
    e.tuned_devices = ("cpu",)
    return compiled, e


def test_first_call_on_a_tuned_device_times_candidates_and_caches(tmp_path: Path) -> None:
    timed: list[Any] = []

    def fake(kc: Any, program: Any) -> float:  # fastest: 64-deep K steps over 3 stages
        timed.append(kc.gpu)
        return 1.0 - 0.5 * (kc.gpu.block_k == 64) - 0.25 * (kc.gpu.stages == 3)

    compiled, e = _executor(tmp_path, fake)
    (k,) = e.program.kernels
    cands = candidates(k, get_target("h100"))
    assert k.gpu.block_k != 64 or k.gpu.stages != 3  # the table's tiles are not the fake's pick
    torch.testing.assert_close(compiled(*INPUTS), _fn(*INPUTS), rtol=2e-5, atol=2e-5)
    assert timed == cands and e.autotuner.timed == len(cands)
    (ln,) = e.kernels
    assert ln.stages == 3 and "x64 fp32" in e.source  # what runs (and `source` shows) is the choice
    compiled(*INPUTS)
    assert len(timed) == len(cands)  # once per device, not per call
    assert len(json.loads((tmp_path / "triton" / "autotune.json").read_text())) == 1

    def refuse(kc: Any, program: Any) -> float:
        raise AssertionError("a cached choice is not timed again")

    compiled2, e2 = _executor(tmp_path, refuse)
    torch.testing.assert_close(compiled2(*INPUTS), _fn(*INPUTS), rtol=2e-5, atol=2e-5)
    assert e2.autotuner.timed == 0 and e2.source == e.source


def test_the_interpreter_never_tunes(tmp_path: Path) -> None:
    compiled = compile_triton(_fn, INPUTS, cache_dir=tmp_path)
    e = compiled.compiled.executor
    e.tuning = dataclasses.replace(e.tuning, timer=lambda folder: pytest.fail("timed in the interpreter"))
    torch.testing.assert_close(compiled(*INPUTS), _fn(*INPUTS), rtol=2e-5, atol=2e-5)
    assert e.autotuner is None and not (tmp_path / "triton" / "autotune.json").exists()


def test_the_autotune_option_turns_it_off(tmp_path: Path) -> None:
    assert compile_triton(_fn, INPUTS, cache_dir=tmp_path, autotune=False).compiled.executor.tuning is None
