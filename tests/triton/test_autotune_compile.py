"""The autotuner compiles every candidate ahead of timing, all at once and concurrently
(`Autotuner._prepare`, `TemplateTimer.prepare`): a timer with `prepare` gets every candidate of
every template still to be tuned in one call, before the first is timed; the cached templates'
are left out; `TemplateTimer` compiles them in a thread pool (checked with a barrier that only
concurrent compiles pass), and for sm_90 without a GPU (the real offline compile)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

from vfuse.codegen.triton.autotune import TemplateTimer, tune_key
from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.render import render
from vfuse.schedule.gpu import candidates
from vfuse.schedule.kernel import ContractionKernel
from vfuse.targets import get_target

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key  # noqa: E402

H100 = get_target("h100")


def _two_gemms(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1) @ w2


INPUTS = (torch.randn(9, 70), torch.randn(70, 33), torch.randn(33, 21))


class FakeTimer:
    """Records the order of `prepare` and timing calls; prefers 3 stages."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def prepare(self, kernels: Any, program: Any) -> None:
        self.events.append(("prepare", [(k.name, k.gpu) for k in kernels]))

    def __call__(self, k: Any, program: Any) -> float:
        self.events.append(("time", (k.name, k.gpu)))
        return 1.0 - 0.5 * (k.gpu.stages == 3)


def _run(cache: Path, timer: FakeTimer) -> Any:
    compiled = compile_triton(_two_gemms, INPUTS, cache_dir=cache)
    e = compiled.compiled.executor
    e.tuning = dataclasses.replace(e.tuning, timer=lambda folder: timer)
    e.tuned_devices = ("cpu",)
    torch.testing.assert_close(compiled(*INPUTS), _two_gemms(*INPUTS), rtol=2e-5, atol=2e-5)
    return e


def test_every_candidate_of_every_template_is_prepared_at_once_before_timing(tmp_path: Path) -> None:
    timer = FakeTimer()
    e = _run(tmp_path, timer)
    gemms = [k for k in e.program.kernels if isinstance(k, ContractionKernel)]
    assert len(gemms) == 2
    want = [(k.name, c) for k in gemms for c in candidates(k, H100)]
    (first, *timed) = timer.events
    assert first == ("prepare", want)  # one call, both templates' candidates, before any timing
    assert [ev for ev, _ in timed] == ["time"] * len(want) and [x for _, x in timed] == want
    assert e.autotuner.compile_s > 0

    again = FakeTimer()  # both choices cached: nothing compiled ahead, nothing timed
    _run(tmp_path, again)
    assert again.events == []


def test_a_template_already_cached_is_not_compiled_ahead(tmp_path: Path) -> None:
    e = _run(tmp_path, FakeTimer())
    gemms = [k for k in e.program.kernels if isinstance(k, ContractionKernel)]
    # drop the second template's choice from the cache: only its candidates are prepared again
    tuner = e.autotuner
    del tuner.choices[tune_key(gemms[1], "h100")]
    tuner._write()
    timer = FakeTimer()
    _run(tmp_path, timer)
    assert timer.events[0] == ("prepare", [(gemms[1].name, c) for c in candidates(gemms[1], H100)])


def _kernels(tmp_path: Path) -> tuple[list[ContractionKernel], Any]:
    e = compile_triton(_two_gemms, INPUTS, cache_dir=tmp_path).compiled.executor
    k = next(k for k in e.program.kernels if isinstance(k, ContractionKernel))
    return [dataclasses.replace(k, gpu=c) for c in candidates(k, H100)], e.program


def test_template_timer_compiles_candidates_concurrently(tmp_path: Path) -> None:
    """Two compiles wait for each other at a barrier: serial compiles would time out there."""
    kernels, program = _kernels(tmp_path)
    assert len(kernels) >= 2
    barrier = threading.Barrier(2, timeout=30)
    calls: list[tuple[str, int, int]] = []

    def fake_compile(module: Any, fn: str, sig: Any, warps: int, sm: int, stages: int) -> Any:
        if len(calls) < 2:
            calls.append((fn, warps, stages))
            barrier.wait()
        else:
            calls.append((fn, warps, stages))
        return ("compiled", warps, stages, sm)

    timer = TemplateTimer(tmp_path, sm=90, workers=2, compile_fn=fake_compile)
    timer.prepare(kernels, program)
    assert len(calls) == len(kernels)
    for k in kernels:  # each candidate's prepared kernel, without compiling again
        compiled, ln = timer.kernel(k, program)
        assert compiled == ("compiled", k.gpu.warps, k.gpu.stages, 90) and ln.warps == k.gpu.warps
    assert len(calls) == len(kernels)


def test_template_timer_prepares_real_sm90_kernels_without_a_gpu(tmp_path: Path) -> None:
    """The real offline compile; and the key Triton's JIT computes at the chosen tiles' first
    launch (the program's own module, aligned pointers: attrs "D", its launch options) equals
    the prepared kernel's, so that launch reads Triton's cache instead of compiling again."""

    kernels, program = _kernels(tmp_path)
    timer = TemplateTimer(tmp_path, sm=90, workers=2)
    timer.prepare(kernels[:2], program)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    for k in kernels[:2]:
        compiled, ln = timer.kernel(k, program)
        assert compiled.metadata.num_warps == k.gpu.warps and compiled.metadata.target.arch == 90
        assert compiled is timer.kernel(k, program)[0]  # compiled once
        tuned = dataclasses.replace(program, steps=tuple(
            dataclasses.replace(s, kernels=tuple(k if x.name == k.name else x for x in s.kernels))
            if hasattr(s, "kernels") else s for s in program.steps))  # fmt: skip
        rendered = render(tuned)
        fn = getattr(load_module(module_path(rendered.source, tmp_path), False), ln.fn)
        sig = rendered.signatures[ln.fn]
        attrs = {(i,): backend.parse_attr("D") for i in range(len(sig))}
        options = backend.parse_options(
            {"num_warps": ln.warps, "num_stages": ln.stages, "debug": False,
             "instrumentation_mode": triton.knobs.compilation.instrumentation_mode}
        )  # fmt: skip
        key = get_cache_key(ASTSource(fn, sig, {}, attrs), backend, options, get_cache_invalidating_env_vars())
        assert hashlib.sha256(key.encode()).hexdigest() == compiled.hash
