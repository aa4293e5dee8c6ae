"""How well the cost model predicts vfuse's own kernels: generate varied graphs, compile each with
vfuse, time every generated kernel (`CompiledGraph.profile`) and compare with its prediction.

    python benchmarks/cost_check.py [--graphs 120] [--reps 10] [--seed 0] [--isa avx2] [--threads 1] [--json out.json]
                                    [--time-limit 600] [--kinds attention,column]

Run `vfuse calibrate` first (for each tier checked): the cost model prices vfuse's kernels with the
rates calibrated on them. On a loaded machine use --threads 1 (a kernel on two threads waits for a
preempted one) and read the "best" figures (the fastest rep) next to the medians: the kernels are
timed by the wall clock, so a preempted rep counts in full (a load of 11 on 2 cores took the
120-graph run from 5 to 15 minutes and moved row kernels' median ratio from 0.87 to 0.69).
--time-limit stops starting graphs past that many seconds and reports those done ("graphs_run").

Graph kinds: pointwise chains (1-6 ops, cheap and transcendental), broadcasts, row reductions
(sum, softmax, LayerNorm, RMSNorm), column reductions, GEMM + epilogue, conv2d, attention; sizes from
launch-bound (~1K elements) to larger than the last-level cache. Reported over every generated
kernel (torch steps left out): Spearman rank correlation of predicted vs measured time, and the
median of |predicted / measured - 1|. The bar (issue 12): Spearman >= 0.9, median <= 25 %, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

Fn = Callable[..., Any]

UNARY: dict[str, Fn] = {
    "relu": torch.relu,
    "exp": torch.exp,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "silu": F.silu,
    "neg": torch.neg,
    "abs": torch.abs,
    "sqrt_abs": lambda t: torch.sqrt(torch.abs(t)),
    "square": lambda t: t * t,
}


@dataclass(frozen=True)
class Case:
    """One generated graph: a name saying what and how big, the function and its inputs."""

    name: str
    kind: str
    fn: Fn
    inputs: tuple[torch.Tensor, ...]


HI = [24]  # log2 of the largest pointwise size (the test suite's small version lowers it)


def _elements(rng: random.Random, lo: int = 10, hi: int | None = None) -> int:
    """A size between 2^lo and 2^hi elements, log-uniform, not a power of two half of the time."""
    n = 2 ** rng.uniform(lo, HI[0] if hi is None else hi)
    return int(n) if rng.random() < 0.5 else 2 ** round(math.log2(n))


def _rows_cols(rng: random.Random, lo: int = 10, hi: int | None = None) -> tuple[int, int]:
    n = _elements(rng, lo, hi)
    cols = rng.choice([32, 64, 100, 128, 256, 384, 512, 768, 1000, 1024, 2048, 4096])
    return max(1, n // cols), cols


def pointwise(rng: random.Random) -> Case:
    ops = [rng.choice(list(UNARY)) for _ in range(rng.randint(1, 6))]
    n = _elements(rng)
    binary = rng.random() < 0.5

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = x + y if binary else x
        for op in ops:
            t = UNARY[op](t)
        return t

    return Case(
        f"pointwise {'add>' if binary else ''}{'>'.join(ops)} n={n}", "pointwise", fn, (torch.randn(n), torch.randn(n))
    )


def broadcast(rng: random.Random) -> Case:
    r, c = _rows_cols(rng)
    op = rng.choice(["relu", "gelu", "exp", "tanh"])

    def fn(x: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return UNARY[op](x * s + b)

    return Case(
        f"broadcast x*s[r,1]+b[c] > {op} {r}x{c}",
        "broadcast",
        fn,
        (torch.randn(r, c), torch.randn(c), torch.randn(r, 1)),
    )


def row_reduction(rng: random.Random) -> Case:
    r, c = _rows_cols(rng)
    what = rng.choice(["sum", "softmax", "layernorm", "rmsnorm", "logsumexp"])
    w = torch.randn(c)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if what == "sum":
            return x.sum(-1)
        if what == "softmax":
            return torch.softmax(x, -1)
        if what == "layernorm":
            return F.layer_norm(x, (c,), w)
        if what == "logsumexp":
            return torch.logsumexp(x, -1)
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    return Case(f"row {what} {r}x{c}", "row", fn, (torch.randn(r, c), w))


def column_reduction(rng: random.Random) -> Case:
    r, c = _rows_cols(rng)
    what = rng.choice(["sum", "mean", "max"])

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.amax(0) if what == "max" else (x.sum(0) if what == "sum" else x.mean(0))

    return Case(f"column {what} {r}x{c}", "column", fn, (torch.randn(r, c),))


def gemm(rng: random.Random) -> Case:
    m, n, k = (rng.choice([16, 32, 48, 64, 96, 128, 200, 256, 384, 512, 768, 1024]) for _ in range(3))
    act = rng.choice(["none", "relu", "gelu", "silu"])

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = x @ w + b
        return y if act == "none" else UNARY[act](y)

    return Case(f"gemm+bias>{act} {m}x{k}x{n}", "gemm", fn, (torch.randn(m, k), torch.randn(k, n), torch.randn(n)))


def conv(rng: random.Random) -> Case:
    b, cin, cout = rng.choice([1, 2, 4]), rng.choice([3, 8, 16, 32, 64]), rng.choice([8, 16, 32, 64])
    hw, ks, stride = rng.choice([8, 14, 16, 28, 32, 56]), rng.choice([1, 3]), rng.choice([1, 2])

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.conv2d(x, w, stride=stride, padding=ks // 2))

    inputs = (torch.randn(b, cin, hw, hw), torch.randn(cout, cin, ks, ks))
    return Case(f"conv{ks}x{ks}/s{stride}+relu {b}x{cin}x{hw}x{hw}->{cout}", "conv", fn, inputs)


def attention(rng: random.Random) -> Case:
    b, h, s, d = rng.choice([1, 2]), rng.choice([1, 2, 4, 8]), rng.choice([16, 64, 128, 256, 512]), rng.choice([32, 64])
    causal = rng.random() < 0.5

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    shape = (b, h, s, d)
    return Case(
        f"attention{' causal' if causal else ''} {b}x{h}x{s}x{d}",
        "attention",
        fn,
        tuple(torch.randn(shape) for _ in range(3)),
    )


KINDS = [pointwise, pointwise, broadcast, row_reduction, row_reduction, column_reduction, gemm, conv, attention]


def cases(count: int, seed: int, max_log2: int = 24) -> list[Case]:
    """`count` graphs cycling through the kinds (pointwise and row kernels twice as often), the
    pointwise and row ones of up to 2^max_log2 elements."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    HI[0] = max_log2
    return [KINDS[i % len(KINDS)](rng) for i in range(count)]


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    a = np.asarray(values, dtype=float)
    order = a.argsort(kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):
        tied = a == v
        r[tied] = r[tied].mean()
    return r


def spearman(x: list[float], y: list[float]) -> float:
    if len(x) < 2:
        return float("nan")
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


@dataclass(frozen=True)
class Measured:
    case: str
    kind: str
    kernel: str
    pattern: str
    predicted_s: float
    measured_s: float
    best_s: float
    flops: int = 0
    bytes: int = 0
    bound: str = ""


def profile_case(case: Case, reps: int, threads: int | None = None, **options: Any) -> list[Measured]:
    """Compile one case with vfuse and profile it; its generated kernels (not torch steps)."""
    import vfuse

    g = vfuse.compile(case.fn, case.inputs, **options)
    rows = g.profile(*case.inputs, reps=reps, threads=threads)
    return [
        Measured(
            case.name, case.kind, r.name, r.label, r.predicted_s, r.measured_s, r.best_s, r.flops, r.bytes, r.bound
        )
        for r in rows
        if r.runs != "torch" and r.predicted_s is not None and r.measured_s > 0
    ]


def summary(rows: list[Measured], use: str = "measured_s") -> dict[str, float]:
    pred = [r.predicted_s for r in rows]
    meas = [getattr(r, use) for r in rows]
    errors = [abs(p / m - 1) for p, m in zip(pred, meas)]
    return {
        "kernels": len(rows),
        "spearman": spearman(pred, meas),
        "median_abs_error": statistics.median(errors) if errors else float("nan"),
        "within_25pct": sum(e <= 0.25 for e in errors) / max(len(errors), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=120)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--threads", type=int, help="run kernels on this many threads, predicted for as many cores")
    ap.add_argument("--json", help="write every kernel's figures here")
    ap.add_argument("--time-limit", type=float, help="start no graph past this many seconds")
    ap.add_argument("--kinds", help="check only these kinds (comma-separated), the same graphs as in a full run")
    ns = ap.parse_args(argv)
    start, rows, failed, run, load = time.perf_counter(), [], [], 0, os.getloadavg()[0]
    kinds = set(ns.kinds.split(",")) if ns.kinds else None
    for i, case in enumerate(cases(ns.graphs, ns.seed)):
        if kinds is not None and case.kind not in kinds:
            continue
        if ns.time_limit is not None and time.perf_counter() - start > ns.time_limit:
            break
        run += 1
        try:
            got = profile_case(case, ns.reps, ns.threads, isa=ns.isa)
        except Exception as e:  # a case vfuse cannot compile is reported, not fatal to the check
            failed.append(f"{case.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        rows += got
        for r in got:
            times = f"pred {r.predicted_s * 1e6:10.1f} us  meas {r.measured_s * 1e6:10.1f} us"
            print(
                f"{i:4d} {r.case:48.48s} {r.kernel:8s} {times}  ratio {r.predicted_s / r.measured_s:6.2f}", flush=True
            )
    by_kind = {k: summary([r for r in rows if r.kind == k]) for k in dict.fromkeys(r.kind for r in rows)}
    result = {
        "graphs": ns.graphs,
        "graphs_run": run,
        "failed": failed,
        "isa": ns.isa,
        "threads": ns.threads,
        "seconds": time.perf_counter() - start,
        "load": [load, os.getloadavg()[0]],  # the 1-minute load average at the start and the end
        "median": summary(rows),
        "best": summary(rows, "best_s"),
        "by_kind": by_kind,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "by_kind"}, indent=1))
    for kind, s in by_kind.items():
        err = s["median_abs_error"]
        print(f"  {kind:10s} {s['kernels']:4d} kernels  spearman {s['spearman']:.3f}  median |pred/meas-1| {err:.2f}")
    if ns.json:
        result["kernels"] = [r.__dict__ for r in rows]
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
