"""Cold and warm compile times, each measured in a fresh process.

In-process "cold" numbers lie: Dynamo, Inductor and vfuse all keep in-memory caches, and
imports warm up lazily. So each measurement is a child process (`python -m
vfuse.bench.compile_times ...`) that builds the workload, makes the first (compiling) call
and a few more, and prints one JSON line. Cold: fresh, empty VFUSE_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR. Warm: a second child on the same, now populated, directories.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vfuse.bench.contenders import CONTENDERS, select
from vfuse.bench.results import CompileTime
from vfuse.bench.workloads import WORKLOADS

_PROBE_TIMEOUT_S = 900
_STEADY_CALLS = 5
# Imported before the clock starts: a compile-time figure should not include Python importing
# the backend's modules (whoever imports first pays). Only the contender's own backend, so a
# probe of one does not pay to import the other.
_PREIMPORT = {
    "dynamo": ("torch._dynamo",),
    "inductor": ("torch._dynamo", "torch._inductor.compile_fx"),
    "vfuse": ("torch._dynamo", "vfuse.frontend.capture", "vfuse.compiler"),
}


def _preimport(contender: str) -> None:
    for name in _PREIMPORT.get(contender, ()):
        try:
            importlib.import_module(name)
        except ImportError:  # a module that cannot load is reported by the compile itself
            pass


def _probe(contender: str, workload: str, quick: bool, threads: int, allow_fallback: bool) -> dict[str, float]:
    """Child side: first call (compile + run) and the median of a few steady calls."""
    torch.set_num_threads(threads)
    _preimport(contender)
    torch._dynamo.reset()
    instance = WORKLOADS[workload].build(quick)
    with torch.no_grad():
        (chosen,) = [c for c in select([contender], allow_fallback) if c.name == contender]
        compiled = chosen.prepare_for(WORKLOADS[workload].frozen)(instance.module).fn
        start = time.perf_counter()
        compiled(*instance.inputs)
        first = time.perf_counter() - start
        steady = []
        for _ in range(_STEADY_CALLS):
            start = time.perf_counter()
            compiled(*instance.inputs)
            steady.append(time.perf_counter() - start)
    return {"first_call_s": first, "steady_call_s": sorted(steady)[len(steady) // 2]}


def _run_child(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    cmd = [sys.executable, "-m", "vfuse.bench.compile_times", *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"probe exited {proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_compile_time(
    contender: str, workload: str, quick: bool, threads: int, allow_fallback: bool = False
) -> CompileTime:
    """Parent side: one cold child on empty caches, then one warm child on the same caches."""
    argv = [contender, workload, "--threads", str(threads)]
    argv += ["--quick"] if quick else []
    argv += ["--allow-fallback"] if allow_fallback else []
    with tempfile.TemporaryDirectory(prefix="vfuse-bench-cache-") as tmp:
        env = {
            **os.environ,
            "VFUSE_CACHE_DIR": str(Path(tmp) / "vfuse"),
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
        }
        try:
            cold = _run_child(argv, env)
            warm = _run_child(argv, env)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            return CompileTime(contender, workload, None, None, None, f"{type(exc).__name__}: {exc}")
    steady = min(cold["steady_call_s"], warm["steady_call_s"])
    return CompileTime(contender, workload, cold["first_call_s"], warm["first_call_s"], steady, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compile-time probe (run by vfuse bench --compile-times)")
    parser.add_argument("contender", choices=list(CONTENDERS))
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--allow-fallback", action="store_true")
    args = parser.parse_args(argv)
    threads_before = torch.get_num_threads()  # restored: tests call this in-process
    try:
        print(json.dumps(_probe(args.contender, args.workload, args.quick, args.threads, args.allow_fallback)))
    finally:
        torch.set_num_threads(threads_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
