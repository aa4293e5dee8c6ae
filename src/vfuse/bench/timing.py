"""Interleaved timing and the copy-bandwidth yardstick.

The machine is shared and noisy, so contenders are not timed one after another: each round
times every contender once, in an order rotated per round, and the summary is the median
and interquartile range over rounds. Slow drift (another job starting, thermal state) then
hits every contender about equally instead of whichever happened to run last.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# Upper bound on calls batched into one sample: keeps a sample of a microsecond-scale
# contender meaningful against timer resolution without letting one round take forever.
_MAX_INNER = 10_000


@dataclass(frozen=True)
class Stats:
    """Per-call seconds over rounds; each sample is the mean of `inner_loops` back-to-back calls."""

    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    inner_loops: int
    samples_s: tuple[float, ...]

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @staticmethod
    def from_samples(samples: list[float], inner_loops: int) -> Stats:
        q1, median, q3 = (float(v) for v in np.percentile(samples, [25, 50, 75]))
        return Stats(median, q1, q3, min(samples), inner_loops, tuple(samples))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Stats:
        return Stats(
            float(data["median_s"]),
            float(data["q1_s"]),
            float(data["q3_s"]),
            float(data["min_s"]),
            int(data["inner_loops"]),
            tuple(float(s) for s in data["samples_s"]),
        )


@dataclass(frozen=True)
class TimingConfig:
    warmup: int
    reps: int
    min_sample_s: float  # batch calls until one sample lasts at least this long


def _time_once(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def _inner_loops(fn: Callable[[], object], min_sample_s: float) -> int:
    one_call = max(_time_once(fn, 1), 1e-9)
    return max(1, min(_MAX_INNER, math.ceil(min_sample_s / one_call)))


def measure(fns: Mapping[str, Callable[[], object]], config: TimingConfig) -> dict[str, Stats]:
    """Warm up every callable, then time them round-robin; returns per-call statistics."""
    names = list(fns)
    for name in names:
        for _ in range(config.warmup):
            fns[name]()
    inner = {name: _inner_loops(fns[name], config.min_sample_s) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    # A collection pause inside one contender's sample would be charged to it alone.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rnd in range(config.reps):
            shift = rnd % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(_time_once(fns[name], inner[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Stats.from_samples(samples[name], inner[name]) for name in names}


def copy_callables(traffic_bytes: int) -> tuple[dict[str, Callable[[], object]], int]:
    """Copy kernels that move about `traffic_bytes` (half read, half written).

    `copy` writes into a preallocated, already-touched buffer: the bandwidth ceiling.
    `copy_fresh` allocates its destination each call, like an unfused op writing its output,
    so it also pays allocation and first-touch page faults. Returns (callables, exact bytes).
    """
    numel = max(1, traffic_bytes // 2 // 4)
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.zeros_like(src)  # zeros_: touch every page now, not inside the first sample

    def copy() -> object:
        return dst.copy_(src)

    def copy_fresh() -> object:
        return torch.empty_like(src).copy_(src)

    return {"copy": copy, "copy_fresh": copy_fresh}, 2 * src.nbytes
