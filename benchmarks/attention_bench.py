"""Attention benchmark: written-out attention vs torch SDPA vs vfuse's flash-attention kernel,
and the kernel's extra memory as the sequence grows.

    .venv/bin/python benchmarks/attention_bench.py [--rounds 7] [--threads 2] [--json out.json]

Timing: [4, 8, 1024, 64] fp32, non-causal and causal. Every contender runs once per round, in
turn (interleaved, so load changes on a shared machine hit all of them alike); the table shows
medians and ratios. Memory: a fresh subprocess per (contender, N) measures its peak RSS growth
during one call (VmHWM after resetting it through /proc/self/clear_refs), minus the output;
the kernel's figure is also computed from its buffers (workspace bytes x threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.attention import AttentionSpec, FlashAttentionKernel
from vfuse.schedule.microtile import attention_tile, vector_unit
from vfuse.targets import get_target

SHAPE = (4, 8, 1024, 64)
MEM_HEADS, MEM_LENGTHS = (1, 8), (1024, 4096, 8192)
EAGER_MEM_MAX = 4096  # the written-out form needs B*H*N*N*4 bytes per score tensor; beyond this, computed only


def _written_out(causal: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    return attention


def host_spec(name: str, head_dim: int, causal: bool = False) -> AttentionSpec:
    """The kernel as a compiled graph on this machine gets it: the tier's vector width and register tile
    (the spec's defaults are AVX-512's; on AVX2 their 4 x 64 tile spills, 8x slower, 2026-12-02)."""
    target = get_target("cpu")
    unit = vector_unit(int(target.simd_lanes), int(target.regs_per_thread))
    _, tile = attention_tile(unit)
    return AttentionSpec(name=name, head_dim=head_dim, causal=causal, lanes=unit.lanes, tile=tile)


def _contenders(causal: bool, threads: int) -> dict[str, Callable[..., torch.Tensor]]:
    kern = FlashAttentionKernel(host_spec(f"bench_fa_{int(causal)}", SHAPE[-1], causal))
    return {
        "eager (written out)": _written_out(causal),
        "eager SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "vfuse flash kernel": lambda q, k, v: kern(q, k, v, threads=threads),
    }


def time_contenders(causal: bool, rounds: int, threads: int) -> dict[str, float]:
    """Median seconds per call of each contender (interleaved rounds, after one warm-up)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(SHAPE) for _ in range(3))
    fns = _contenders(causal, threads)
    ref = fns["eager SDPA"](q, k, v)
    for name, fn in fns.items():  # warm-up doubles as a correctness check
        torch.testing.assert_close(fn(q, k, v), ref, rtol=1e-4, atol=1e-4, msg=name)
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(q, k, v)
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) for n, t in times.items()}


def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(kind: str, n: int, threads: int) -> None:
    """In a fresh process: peak RSS growth (bytes) of one call, output excluded; prints JSON."""
    torch.set_num_threads(threads)
    b, h = MEM_HEADS
    d = SHAPE[-1]
    kern = FlashAttentionKernel(host_spec("bench_fa_mem", d))
    fn = _written_out(False) if kind == "eager" else (lambda q, k, v: kern(q, k, v, threads=threads))
    small = [torch.randn(b, h, 64, d) for _ in range(3)]
    fn(*small)  # load the library, start the OpenMP / torch thread pools
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    out = fn(q, k, v)
    seconds = time.perf_counter() - start
    growth = (_status_kb("VmHWM") - base) * 1024 - out.numel() * 4
    print(json.dumps({"kind": kind, "n": n, "extra_bytes": growth, "seconds": seconds}))


def measure_memory(kind: str, n: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(n), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:9.1f} MiB"


def _kib(n: float) -> str:
    return f"{n / 2**10:9.1f} KiB"


def report_timing(rounds: int, threads: int) -> dict:
    results = {}
    flops = 4 * SHAPE[0] * SHAPE[1] * SHAPE[2] ** 2 * SHAPE[3]
    for causal in (False, True):
        med = time_contenders(causal, rounds, threads)
        results["causal" if causal else "full"] = med
        print(f"\nattention {list(SHAPE)} fp32, causal={causal}, {threads} threads, median of {rounds}")
        print(f"{'contender':22} {'ms':>9} {'vs written-out':>15} {'vs SDPA':>8}")
        for name, t in med.items():
            print(f"{name:22} {t * 1e3:9.1f} {med['eager (written out)'] / t:14.2f}x {med['eager SDPA'] / t:7.2f}x")
        kernel = med["vfuse flash kernel"]
        print(f"kernel: {flops / (2 if causal else 1) / kernel / 1e9:.1f} GFLOP/s (useful flops)")
    return results


def report_memory(threads: int) -> list[dict]:
    b, h = MEM_HEADS
    d = SHAPE[-1]
    per_thread = host_spec("bench_fa_mem", d).workspace_bytes()
    print(f"\nextra memory of one call, [{b}, {h}, N, {d}] fp32, {threads} threads (output excluded)")
    print(f"{'N':>6} {'q+k+v+out':>13} {'kernel calc':>13} {'kernel RSS':>13} {'eager scores':>13} {'eager RSS':>13}")
    rows = []
    for n in MEM_LENGTHS:
        kernel = measure_memory("kernel", n, threads)
        eager = measure_memory("eager", n, threads) if n <= EAGER_MEM_MAX else None
        row = {
            "n": n,
            "io_bytes": 4 * b * h * n * d * 4,
            "kernel_computed": per_thread * threads,
            "kernel_measured": kernel["extra_bytes"],
            "eager_scores": b * h * n * n * 4,
            "eager_measured": eager and eager["extra_bytes"],
        }
        rows.append(row)
        shown = _mib(row["eager_measured"]) if eager else "    (not run)"
        print(
            f"{n:6} {_mib(row['io_bytes'])} {_kib(row['kernel_computed'])} {_kib(row['kernel_measured'])} "
            f"{_mib(row['eager_scores'])} {shown}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.threads)
        return
    torch.set_num_threads(args.threads)
    results: dict = {"timing": report_timing(args.rounds, args.threads)}
    if not args.skip_memory:
        results["memory"] = report_memory(args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
