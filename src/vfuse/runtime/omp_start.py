"""torch starts its OpenMP worker threads, and MKL's sin, before a vfuse kernel's parallel region.

Kernels share torch's libgomp (its SONAME is loaded first). Measured (session 26; torch 2.13 with
MKL 2024.2, 2 threads, Xeon AVX-512): when a kernel's `omp parallel` ran before the process's first
torch.sin (MKL vector math inside torch's parallel loop), that torch.sin computed the worker thread's
half of the tensor wrong, by up to 1262 ulps, in 4 of 40 processes (a plain OpenMP loop in a ctypes
library does the same, without vfuse); torch.cos and torch.tan were right in 30 of 30. With one
parallel torch op and a sin over as many chunks first: 0 of 40. So before a native call with more
threads than any before it, that op runs once.
"""

from __future__ import annotations

import threading

import torch

# at::parallel_for gives each thread at least this many elements (ATen's internal GRAIN_SIZE).
GRAIN = 32768


class _Started:
    """The most threads torch has started for us in this process (the pool is per process)."""

    def __init__(self) -> None:
        self.threads = 1
        self.lock = threading.Lock()


_STARTED = _Started()


def start_torch_threads(nt: int) -> None:
    """Run one parallel torch add and sin over `nt` chunks unless they have run (cheap when so)."""
    if nt <= _STARTED.threads:
        return
    with _STARTED.lock:
        if nt > _STARTED.threads:
            torch.zeros(nt * GRAIN * 2).add_(1.0).sin_()
            _STARTED.threads = nt
