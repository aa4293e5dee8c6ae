"""Peak extra memory of written-out attention under vfuse (torch.compile) vs eager, as N grows.

    .venv/bin/python benchmarks/attention_memory.py [--lengths 1024,4096,8192] [--threads 2] [--json out.json]

The module is the bench workload's `softmax(q @ k^T * scale) @ v` on [1, 8, N, 64] fp32 (not
SDPA), so an attention kernel must be found by the compiler. Eager materializes the [N, N]
scores per head (B*H*N*N*4 bytes, 2 GiB at N = 8192, more with softmax's copy), so eager is run
only up to --eager-max (4096). A flash-style kernel needs O(N) extra instead.

Each (contender, N) runs in a fresh subprocess, with glibc's mmap threshold pinned at 64 KiB
(GLIBC_TUNABLES; a fixed threshold also stops glibc from raising it after frees): every
allocation of 64 KiB or more is a fresh mapping returned to the OS when freed, so a call's
buffers cannot hide in memory an earlier call freed. In the child: build inputs, make the first
call (vfuse: compiles at this exact shape, dynamic=False; eager: a small warm-up loads the
libraries), reset VmHWM to the current RSS through /proc/self/clear_refs, make one more call,
and report VmHWM - VmRSS(before) - output bytes: the peak memory that one steady call added.

vfuse also holds an arena for its kernels' intermediates, allocated at the first call and kept:
it is not in the steady call's growth, so it is read from the compiled graphs' stats and added
("vfuse total"). The first call's growth (compilation included) is shown for reference.
Allocations under 64 KiB can come from heap or stack pages already resident and then do not
show: vfuse's flash kernel computes its per-thread workspace as ~49 KiB (AttentionSpec), so a
few pages of growth is the expected reading.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

HEADS, HEAD_DIM = 8, 64
EAGER_MAX = 4096
_CHILD_TIMEOUT_S = 900
_CHILD_ENV = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset VmHWM to the current RSS (clear_refs 5) and return the RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS") * 1024


def _peak_growth(fn: Any, inputs: tuple[torch.Tensor, ...]) -> tuple[int, float, torch.Tensor]:
    """Bytes one call added at its peak (output excluded), its seconds, and the output."""
    base = _reset_peak()
    start = time.perf_counter()
    out = fn(*inputs)
    seconds = time.perf_counter() - start
    return _status_kb("VmHWM") * 1024 - base - out.nbytes, seconds, out


def child(kind: str, n: int, threads: int) -> dict[str, Any]:
    """In a fresh process: the figures for one contender at one N."""
    from vfuse.bench.workloads_compute import Attention

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(1, HEADS, n, HEAD_DIM, generator=gen) for _ in range(3))
    first = arena = stats = None
    if kind == "vfuse":
        import vfuse

        backend = vfuse.backend(strict=True)
        fn = torch.compile(Attention(), backend=backend, dynamic=False)
        # Compiles at this shape. Its output stays referenced: vfuse pools output buffers, and
        # a steady call that got this one back would allocate nothing for its output.
        first, _, _kept_alive = _peak_growth(fn, inputs)
        arena = sum(c.stats.arena_bytes for c in backend.compiled)
        stats = {k: dict(v) if isinstance(v, dict) else v for k, v in backend.stats.items()}  # kernels, fallbacks
    else:
        fn = Attention()
        fn(*(t[:, :, :64] for t in inputs))  # load oneDNN/MKL and start the thread pool
    extra, seconds, _ = _peak_growth(fn, inputs)
    held = extra + (arena or 0)
    return {
        "kind": kind, "n": n, "extra_bytes": extra, "arena_bytes": arena, "total_bytes": held,
        "first_call_extra_bytes": first, "seconds": seconds, "backend_stats": stats,
    }  # fmt: skip


def measure(kind: str, n: int, threads: int) -> dict[str, Any]:
    """Run `child` in a fresh interpreter; an error is a result (its last stderr line)."""
    cmd = [sys.executable, __file__, "--child", kind, str(n), "--threads", str(threads)]
    env = {**os.environ, **_CHILD_ENV}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"kind": kind, "n": n, "error": tail[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(row: dict[str, Any] | None, key: str = "extra_bytes") -> str:
    if row is None:
        return f"{'(not run)':>12}"
    if "error" in row:
        return f"{'ERROR':>12}"
    value = row.get(key)
    if value is None:
        return f"{'-':>12}"
    # A flash-style kernel's few pages would all print as 0.0 MiB.
    return f"{value / 2**20:8.1f} MiB" if abs(value) >= 2**20 else f"{value / 2**10:8.1f} KiB"


def report(lengths: list[int], threads: int, eager_max: int) -> list[dict[str, Any]]:
    print(f"peak extra memory of one call, attention [1, {HEADS}, N, {HEAD_DIM}] fp32, {threads} threads")
    print("(VmHWM growth over VmRSS before the call, output excluded; fresh process per cell)")
    heads = ("N", "scores", "eager", "vfuse call", "vfuse arena", "vfuse total", "vfuse 1st", "total/eager")
    print(f"{heads[0]:>6} " + " ".join(f"{h:>12}" for h in heads[1:]))
    rows = []
    for n in lengths:
        eager = measure("eager", n, threads) if n <= eager_max else None
        fused = measure("vfuse", n, threads)
        scores = HEADS * n * n * 4  # one [1, H, N, N] fp32 tensor
        ok = eager and "error" not in eager and "error" not in fused and eager["extra_bytes"] > 0
        ratio = f"{fused['total_bytes'] / eager['extra_bytes']:11.2g}x" if ok else f"{'-':>12}"
        cells = [_mib(eager), _mib(fused), _mib(fused, "arena_bytes"), _mib(fused, "total_bytes")]
        print(f"{n:6} {scores / 2**20:8.1f} MiB {' '.join(cells)} {_mib(fused, 'first_call_extra_bytes')} {ratio}")
        rows.append({"n": n, "scores_bytes": scores, "eager": eager, "vfuse": fused})
    for row in rows:
        for kind in ("eager", "vfuse"):
            if row[kind] and "error" in row[kind]:
                print(f"ERROR {kind} N={row['n']}: {row[kind]['error']}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,4096,8192", help="comma-separated sequence lengths N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eager-max", type=int, default=EAGER_MAX, help="largest N eager runs at")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads)))
        return
    rows = report([int(n) for n in args.lengths.split(",")], args.threads, args.eager_max)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
