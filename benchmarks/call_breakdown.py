"""Where one call of a `vfuse bench` workload goes: Dynamo + vfuse's call path + the kernels.

    .venv/bin/python benchmarks/call_breakdown.py layernorm_small [--threads 2] [--rounds 20] [--quick]

Compiles the workload as the bench does (`torch.compile(module, backend=vfuse.backend(strict=True,
freeze=...))`, under no_grad) and times single calls of, alternating in blocks:
- `full`: the compiled module, as the bench calls it;
- `executor`: vfuse's executor alone on the graph's inputs (its call path + the kernels);
- `kernels`: the native entry points alone on the bound pointers (lean path only);
- `overhead`: `full` with every entry point swapped for a C function that returns at once, i.e.
  Dynamo's frame and guards + vfuse's call path (pool, pointers, ctypes), no kernel, warm caches;
- `around`: in `full` calls, the time outside the kernels (entry points timed from Python, ~1 us
  each added): the same work as `overhead` but after kernels that streamed the workload's bytes
  through the caches, as in the bench;
- `copy`: the bench's yardstick (`bench.timing.copy_callables`: the workload's bytes, half read,
  half written, into a buffer already touched).
Prints low quantiles, not means: on a loaded 2-core host (other jobs), 2-thread medians measure
the scheduler (a descheduled OpenMP thread stalls the whole call), the minimum and 10th
percentile what the code can do (docs/perf-log.md, 2026-12-02 H4 session 14).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import vfuse
from vfuse.bench.timing import copy_callables
from vfuse.bench.workloads import WORKLOADS, Workload, minimal_bytes


def _noop_entry(where: Path) -> Callable[..., int]:
    """A C function with the entry points' signature that returns 0 (no fault) at once."""
    src, lib = where / "noop.c", where / "noop.so"
    src.write_text("int vf_noop(void* a, void* b, void* c, int d) { return 0; }\n")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).vf_noop
    fn.restype = ctypes.c_int
    return fn


def _quantiles(samples: list[int]) -> str:
    s = sorted(samples)
    q = [s[int(p * (len(s) - 1))] / 1e3 for p in (0.0, 0.1, 0.25, 0.5)]
    return "min {:8.1f}  p10 {:8.1f}  p25 {:8.1f}  median {:8.1f} us".format(*q)


def breakdown(name: str, threads: int, rounds: int, block: int, quick: bool) -> dict[str, list[int]]:
    """Per-call nanoseconds of each part (see the module docstring), `rounds` x `block` calls each."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _breakdown(WORKLOADS[name], threads, rounds, block, quick)
    finally:
        torch.set_num_threads(before)


def _breakdown(workload: Workload, threads: int, rounds: int, block: int, quick: bool) -> dict[str, list[int]]:
    inst = workload.build(quick)
    backend = vfuse.backend(strict=True, freeze=workload.frozen)
    fn = torch.compile(inst.module, backend=backend)
    args = inst.inputs
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for _ in range(3):
            fn(*args)
        (graph,) = backend.compiled  # one graph: the bench workloads compile whole
        inputs = [*inst.module.parameters(), *args] if not workload.frozen else list(args)
        swaps = _Swaps(graph.executor, lambda: fn(*args), _noop_entry(Path(tmp)), threads)
        copies, _ = copy_callables(minimal_bytes(inst, inst.module(*args)))
        parts: dict[str, Callable[[], object]] = {
            "full": lambda: fn(*args),
            "executor": lambda: graph.executor(inputs[: len(graph.graph.inputs)]),
            "overhead": swaps.overhead,
            "around": swaps.around,
            "copy": copies["copy"],
        }
        if graph.executor.call_plan is not None:
            parts["kernels"] = swaps.kernels
        samples = _time(parts, rounds, block)
        # The entry points swapped in for timing are back: the compiled call still computes (on
        # other values: a no-op kernel would leave the last output in the pool's buffer).
        other = [torch.roll(a, 1) for a in args]
        torch.testing.assert_close(fn(*other), inst.module(*other), rtol=workload.rtol, atol=workload.atol)
        return samples


class _Swaps:
    """Calls that swap a native executor's entry points (private: `_raw_entries`) and put them back."""

    def __init__(self, ex: Any, call: Callable[[], object], noop: Callable[..., int], threads: int) -> None:
        self.ex, self.call, self.threads = ex, call, threads
        self.entries = list(ex._raw_entries)
        self.noops = [noop] * len(self.entries)
        self.inside: list[int] = []

    def kernels(self) -> None:
        ex = self.ex
        ex._threads_arg.value = self.threads
        for e in self.entries:
            e(ex._ptrs, ex._arena_arg, ex._seeds_arg, ex._threads_arg)

    def overhead(self) -> None:
        self.ex._raw_entries = self.noops
        try:
            self.call()
        finally:
            self.ex._raw_entries = self.entries

    def around(self) -> int:
        """Nanoseconds of one call outside its entry points."""
        self.ex._raw_entries = [self._timed(e) for e in self.entries]
        self.inside.clear()
        try:
            t0 = time.perf_counter_ns()
            self.call()
            return time.perf_counter_ns() - t0 - sum(self.inside)
        finally:
            self.ex._raw_entries = self.entries

    def _timed(self, entry: Callable[..., int]) -> Callable[..., int]:
        def call(*a: object) -> int:
            t0 = time.perf_counter_ns()
            try:
                return entry(*a)
            finally:
                self.inside.append(time.perf_counter_ns() - t0)

        return call


def _time(parts: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, list[int]]:
    """Nanoseconds per call of each part, blocks of calls in an order rotated per round; a part
    that returns an int has measured itself."""
    names = list(parts)
    samples: dict[str, list[int]] = {k: [] for k in names}
    clock = time.perf_counter_ns
    enabled = gc.isenabled()
    gc.disable()  # as the bench's timing does
    try:
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                f = parts[k]
                for _ in range(block):
                    t0 = clock()
                    took = f()
                    samples[k].append(took if isinstance(took, int) else clock() - t0)
    finally:
        if enabled:
            gc.enable()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=20, help="calls per part per round")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes")
    args = parser.parse_args(argv)
    samples = breakdown(args.workload, args.threads, args.rounds, args.block, args.quick)
    print(f"{args.workload}, {args.threads} thread(s), {args.rounds} x {args.block} calls per part")
    for k, s in samples.items():
        print(f"  {k:9s} {_quantiles(s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
