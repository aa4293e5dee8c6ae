"""GEMM/conv + fused epilogue kernels (vfuse.codegen.cpp.gemm) against eager torch and Inductor.

    .venv/bin/python benchmarks/gemm_bench.py [--reps 15] [--threads 2] [--no-inductor] [--no-blas]

Workloads (issue #5): linear_gelu 2048x1024 -> 4096, linear_gelu_smallk 16384x64 -> 4096,
conv_bn_relu 8x64x56x56 3x3 pad 1 with BatchNorm folded into a per-channel scale/shift.
Contenders run interleaved (one call each per round) and the median per contender is reported,
because the machine is shared and noisy. Kernels are compiled once into a cache keyed by source.
"""

from __future__ import annotations

import os

# Two OpenMP runtimes live in this process (torch's bundled libgomp and the system one our
# kernels link): with the default spinning wait policy each one's idle workers spin right after
# its call and steal the 2 cores from the other's next call, which inflated torch's interleaved
# 2-thread conv from ~40 to ~105 ms. Passive waiting (read by both runtimes at load) is fairer.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import ctypes
import hashlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import ConvSpec, GemmSpec, render_conv2d, render_gemm
from vfuse.codegen.cpp.gemm import epilogues as E

Fn = Callable[[], torch.Tensor]
FLAGS = ["-std=c++17", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
CACHE = Path(tempfile.gettempdir()) / "vfuse_gemm_bench"


def build(src: str, extra: list[str] | None = None) -> ctypes.CDLL:
    flags = FLAGS + (extra or [])
    key = hashlib.sha256((src + " ".join(flags)).encode()).hexdigest()[:16]
    CACHE.mkdir(exist_ok=True)
    lib = CACHE / f"k_{key}.so"
    if not lib.exists():
        (CACHE / f"k_{key}.cpp").write_text(src)
        subprocess.run(["g++", *flags, str(CACHE / f"k_{key}.cpp"), "-o", str(lib) + ".tmp"], check=True)
        Path(str(lib) + ".tmp").replace(lib)
    return ctypes.CDLL(str(lib))


def native(lib: ctypes.CDLL, name: str, out: torch.Tensor, args: list[torch.Tensor], threads: int) -> Fn:
    """A zero-argument callable running one generated kernel into the preallocated `out`."""
    fn = getattr(lib, name)
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (*args[:2], out, *args[2:])]

    def run() -> torch.Tensor:
        fn(*ptrs, ctypes.c_int(threads))
        return out

    return run


def linear_gelu(m: int, k: int, n: int, threads: int, blas: bool) -> tuple[Fn, dict[str, Fn]]:
    x, w, b = torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)
    name = f"linear_gelu_{m}_{k}_{n}"
    spec = GemmSpec(name, m, n, k, trans_b=True)
    ours = {"vfuse": native(build(render_gemm(spec, E.bias_gelu_erf())), name, torch.empty(m, n), [x, w, b], threads)}
    if blas:
        from vfuse.codegen.cpp.gemm.blas import blas_link_flags, render_gemm_blas

        lib = build(render_gemm_blas(spec, E.bias_gelu_erf()), blas_link_flags())
        ours["vfuse-blas"] = native(lib, name, torch.empty(m, n), [x, w, b], threads)
    return (lambda: F.gelu(F.linear(x, w, b))), ours


def conv_bn_relu(threads: int) -> tuple[Fn, dict[str, Fn]]:
    spec = ConvSpec("conv_bn_relu", 8, 64, 56, 56, 64, 3, 3, padding=(1, 1))
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3) / 24
    mean, var, gamma, beta = torch.randn(64), torch.rand(64) + 0.5, torch.randn(64), torch.randn(64)
    scale = gamma / torch.sqrt(var + 1e-5)
    shift = beta - mean * scale
    out = torch.empty(8, 64, 56, 56)
    lib = build(render_conv2d(spec, E.scale_shift_relu()))
    ours = {"vfuse": native(lib, spec.name, out, [x, w, scale, shift], threads)}

    def eager() -> torch.Tensor:  # what a folded inference Conv-BN-ReLU is in eager mode
        return F.relu(F.conv2d(x, w * scale.view(-1, 1, 1, 1), shift, padding=1))

    return eager, ours


def median_times(fns: dict[str, Fn], reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm up: page in outputs, fill scratch, let Inductor/oneDNN pick kernels
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def run_workload(title: str, eager: Fn, ours: dict[str, Fn], inductor: bool, reps: int) -> None:
    fns = {"eager": eager}
    if inductor:
        fns["inductor"] = torch.compile(eager)
    fns.update(ours)
    ref = eager()
    for key, fn in fns.items():
        err = (fn() - ref).abs().max().item() / ref.abs().max().item()
        assert err < 1e-4, f"{title}/{key}: relative error {err:.2e}"
    t = median_times(fns, reps)
    best = min(t["eager"], t.get("inductor", float("inf")))
    for key, sec in t.items():
        ratios = f"x{sec / t['eager']:.3f} eager   x{sec / best:.3f} best-torch"
        print(f"{title:20s} {key:11s} {sec * 1e3:9.2f} ms   {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--no-blas", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    work = {
        "linear_gelu": lambda: linear_gelu(2048, 1024, 4096, a.threads, not a.no_blas),
        "linear_gelu_smallk": lambda: linear_gelu(16384, 64, 4096, a.threads, not a.no_blas),
        "conv_bn_relu": lambda: conv_bn_relu(a.threads),
    }
    policy = os.environ["OMP_WAIT_POLICY"]
    print(f"threads={a.threads} reps={a.reps} OMP_WAIT_POLICY={policy} (median of interleaved rounds)")
    for title, make in work.items():
        if a.only and title not in a.only.split(","):
            continue
        eager, ours = make()
        with torch.no_grad():
            run_workload(title, eager, ours, not a.no_inductor, a.reps)


if __name__ == "__main__":
    main()
