"""torch starts its OpenMP threads and MKL's sin before a kernel's first parallel region
(`runtime/omp_start.py`).

Without it, a process whose first OpenMP region was a vfuse kernel computed its first torch.sin
wrong in the worker thread's half in about 1 of 10 processes (up to 1262 ulps): a user's eager code
after a compiled model, or a sin the cost model runs in torch. The race is rare per process, so the
suite checks the mechanism and one process end to end; VFUSE_FUZZ=soak runs 40 processes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import vfuse
import vfuse.runtime.native as native
from vfuse.runtime import omp_start

PROBE = """
import torch, vfuse
from vfuse.runtime import omp_start
x = torch.randn(1 << 20)
y = vfuse.compile(lambda v: v * 2.0, (x,))(x)  # a kernel's parallel region first
assert omp_start._STARTED.threads == torch.get_num_threads()
got, want = torch.sin(y), torch.sin(y.double())
bad = int(((got.double() - want).abs() > 1e-6).sum())
assert bad == 0, f"{bad} wrong sines"
print("ok")
"""


def test_started_once_per_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omp_start, "_STARTED", omp_start._Started())
    ran: list[int] = []
    real = torch.zeros
    monkeypatch.setattr(omp_start.torch, "zeros", lambda n: ran.append(n) or real(n))
    omp_start.start_torch_threads(2)
    omp_start.start_torch_threads(2)
    omp_start.start_torch_threads(1)
    assert ran == [2 * 2 * omp_start.GRAIN] and omp_start._STARTED.threads == 2
    omp_start.start_torch_threads(3)  # more threads than before: the new ones start in torch too
    assert ran[-1] == 3 * 2 * omp_start.GRAIN and omp_start._STARTED.threads == 3


@pytest.mark.parametrize("lean", [True, False])
def test_every_native_call_asks_first(lean: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(native, "start_torch_threads", asked.append)
    x = torch.randn(1000)
    fn = (lambda v: v * 2.0) if lean else (lambda v: torch.cumsum(v * 2.0, 0) + 1.0)  # a torch step: general path
    compiled = vfuse.compile(fn, (x,))
    compiled(x)
    compiled(x)
    assert asked[-2:] == [torch.get_num_threads()] * 2


def _probe() -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def test_the_first_torch_sin_after_a_kernel_is_right() -> None:
    out = _probe()
    assert out.strip().endswith("ok"), out


@pytest.mark.skipif(os.environ.get("VFUSE_FUZZ") != "soak", reason="40 processes: make fuzz (VFUSE_FUZZ=soak)")
def test_the_first_torch_sin_after_a_kernel_is_right_in_40_processes() -> None:
    for _ in range(40):
        out = _probe()
        assert out.strip().endswith("ok"), out
