"""Cold and warm compile times, each measured in a fresh process.

In-process "cold" numbers lie: Dynamo, Inductor and vfuse all keep in-memory caches, and
imports warm up lazily. So each measurement is a child process (`python -m
vfuse.bench.compile_times ...`) that builds the workload, makes the first (compiling) call
and a few more, and prints one JSON line. Three children per contender, on one pair of cache
directories (VFUSE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, and TMPDIR: `cache_env`):

- cold: the directories are empty;
- warm: a new process on the directories the cold child filled;
- warm process: warm directories, and before the clock the process compiles and runs another
  small function with the same backend, so Dynamo's, AOTAutograd's and the backend's one-time
  initialization (first-use imports, lazily built tables) is not in the figure.

Before the clock, every probe alike (`_preimport`, `_timed_calls`): imports torch._dynamo,
torch._inductor.compile_fx and torch._inductor.debug (the same torch modules for every
contender, Inductor's backend among them), its own backend's modules (vfuse: the capture
entry and the compiler), builds the model, and runs a full garbage collection.

Each child reports the whole first call (what a user waits for), the time spent inside the
backend alone (from the FX graph Dynamo hands over to the callable it gets back: vfuse's
`VfuseBackend`, AOTAutograd included; Inductor's `compile_fx`, which runs AOTAutograd too),
and the Python garbage collector's pauses inside the first call (a full collection of a heap
holding torch and Dynamo takes ~0.1-0.2 s, and falls wherever the allocation count says).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vfuse.bench.contenders import CONTENDERS, Contender, select
from vfuse.bench.models import MODELS, lookup
from vfuse.bench.results import CompileTime
from vfuse.bench.workloads import WORKLOADS

_PROBE_TIMEOUT_S = 900
_STEADY_CALLS = 5
# Imported before the clock starts, by every contender's probe alike: a compile-time figure
# should not include Python importing modules (whoever imports first pays). The torch modules
# are the same for all: importing torch._inductor.compile_fx (165 modules, ~0.6 s) only in
# Inductor's probe made Dynamo's tracing in vfuse's probe ~1 s slower in a warm process
# (docs/perf-log.md), so one-time torch work was measured against vfuse alone. torch's
# aot_autograd backend helper imports torch._inductor.debug on every call
# (torch/_dynamo/backends/common.py). A contender's own package is imported by its probe only.
_PREIMPORT_TORCH = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.debug")
_PREIMPORT = {"vfuse": ("vfuse.entry.capture", "vfuse.compiler")}
# Where each contender's backend takes the FX graph from Dynamo and returns the callable:
# (module, attribute path). Dynamo's own contender has no backend worth timing.
_BACKEND_ENTRY = {
    "inductor": ("torch._inductor.compile_fx", "compile_fx"),
    "vfuse": ("vfuse.entry.capture", "VfuseBackend.__call__"),
}


def _preimport(contender: str) -> None:
    """Import what every probe imports before the clock, then collect garbage: each probe
    starts its clock with no collection pending from the imports and the model's build."""
    for name in (*_PREIMPORT_TORCH, *_PREIMPORT.get(contender, ())):
        try:
            importlib.import_module(name)
        except ImportError:  # a module that cannot load is reported by the compile itself
            pass
    gc.collect()


class _Stopwatch:
    """Total time inside the outermost calls of the functions it wraps (Inductor's compile_fx
    calls itself through its module global, which is the wrapper)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.total_s += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def _time_backend(contender: str) -> Iterator[_Stopwatch | None]:
    """Wrap the contender's backend entry point while the context is open (tests run probes
    in-process, so the original is put back)."""
    if contender not in _BACKEND_ENTRY:
        yield None
        return
    module_name, path = _BACKEND_ENTRY[contender]
    *owners, name = path.split(".")
    try:
        owner: Any = importlib.import_module(module_name)
        for part in owners:
            owner = getattr(owner, part)
        original = getattr(owner, name)
    except (ImportError, AttributeError):  # the entry moved: no backend figure rather than no probe
        yield None
        return
    watch = _Stopwatch()
    setattr(owner, name, watch.wrap(original))
    try:
        yield watch
    finally:
        setattr(owner, name, original)


class _GcPauses:
    """Total time the cyclic garbage collector ran while this context was open."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._start

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class _OtherFunction(nn.Module):
    """Compiled before the clock in the warm-process probe: ops and shapes no workload has,
    so it initializes Dynamo, AOTAutograd and the backend but warms no cache the measured
    graph could hit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 0.5 + 1.0


def _compile_other(chosen: Contender) -> None:
    other = chosen.prepare(_OtherFunction()).fn
    other(torch.randn(3, 40))


def _timed_calls(compiled: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[float, float, float]:
    """(first call, GC pauses inside it, median of the steady calls after it)."""
    gc.collect()  # no collection pending from building the model: every probe starts level
    with _GcPauses() as pauses:
        start = time.perf_counter()
        compiled(*inputs)
        first = time.perf_counter() - start
    steady = []
    for _ in range(_STEADY_CALLS):
        start = time.perf_counter()
        compiled(*inputs)
        steady.append(time.perf_counter() - start)
    return first, pauses.total_s, sorted(steady)[len(steady) // 2]


def _probe(
    contender: str, workload: str, quick: bool, threads: int, allow_fallback: bool, other: str | None = None
) -> dict[str, float | None]:
    """Child side. other: "before" compiles _OtherFunction before the clock (warm process),
    "after" compiles it after the measurement (so that the caches hold it for a later probe)."""
    torch.set_num_threads(threads)
    _preimport(contender)
    torch._dynamo.reset()
    instance = lookup(workload).build(quick)
    (chosen,) = [c for c in select([contender], allow_fallback) if c.name == contender]
    with torch.no_grad(), _time_backend(contender) as watch:
        if other == "before":
            _compile_other(chosen)
        backend_before = watch.total_s if watch else 0.0
        compiled = chosen.prepare_for(lookup(workload).frozen)(instance.module).fn
        first, gc_s, steady = _timed_calls(compiled, instance.inputs)
        backend_s = watch.total_s - backend_before if watch else None
        if other == "after":
            _compile_other(chosen)
    return {"first_call_s": first, "backend_s": backend_s, "gc_s": gc_s, "steady_call_s": steady}


def _run_child(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    return run_probe("vfuse.bench.compile_times", argv, env, _PROBE_TIMEOUT_S)


def run_probe(module: str, argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run `python -m module argv` in a fresh process; its last stdout line is the JSON result."""
    cmd = [sys.executable, "-m", module, *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"probe exited {proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_env(tmp: str) -> dict[str, str]:
    """The children's environment: every compile cache of both contenders under `tmp`. Inductor
    keeps its precompiled header (~150 MB, ~8 s of g++ CPU to build) under
    `$TMPDIR/torchinductor_<user>/precompiled_headers` whatever TORCHINDUCTOR_CACHE_DIR says
    (`torch._inductor.codecache._HEADER_DIR`), so a "cold" Inductor child found one left by any
    earlier run; TMPDIR is moved under `tmp` too, as vfuse's header is in VFUSE_CACHE_DIR."""
    (Path(tmp) / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "VFUSE_CACHE_DIR": str(Path(tmp) / "vfuse"),
        "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
        "TMPDIR": str(Path(tmp) / "tmp"),
    }


def measure_compile_time(
    contender: str, workload: str, quick: bool, threads: int, allow_fallback: bool = False
) -> CompileTime:
    """Parent side: a cold child on empty caches, then a warm child and a warm-process child
    on the same, now populated, caches."""
    argv = [contender, workload, "--threads", str(threads)]
    argv += ["--quick"] if quick else []
    argv += ["--allow-fallback"] if allow_fallback else []
    with tempfile.TemporaryDirectory(prefix="vfuse-bench-cache-") as tmp:
        env = cache_env(tmp)
        try:
            cold = _run_child([*argv, "--other", "after"], env)
            warm = _run_child(argv, env)
            warm_process = _run_child([*argv, "--other", "before"], env)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            return CompileTime(contender, workload, None, None, None, f"{type(exc).__name__}: {exc}")
    return CompileTime.from_probes(contender, workload, cold, warm, warm_process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compile-time probe (run by vfuse bench --compile-times)")
    parser.add_argument("contender", choices=list(CONTENDERS))
    parser.add_argument("workload", choices=[*WORKLOADS, *MODELS])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--allow-fallback", action="store_true")
    parser.add_argument("--other", choices=("before", "after"), help="also compile another function, when")
    args = parser.parse_args(argv)
    threads_before = torch.get_num_threads()  # restored: tests call this in-process
    try:
        figures = _probe(args.contender, args.workload, args.quick, args.threads, args.allow_fallback, args.other)
        print(json.dumps(figures))
    finally:
        torch.set_num_threads(threads_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
