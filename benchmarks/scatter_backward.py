"""max_pool2d and embedding backward (SCATTER_ADD on CPU) vs eager and Inductor, interleaved.

    python benchmarks/scatter_backward.py [--threads 2] [--reps 30]

Each workload is the backward ATen op alone (the saved indices / token ids as inputs), compiled by
vfuse (vfuse.compile) and Inductor (torch.compile of the same function), and a training step of
the layer (forward + backward through torch.compile, the gradient of the input / weight). One
call of each contender per round, rounds interleaved; prints the median (and least) milliseconds
and the median's speedup over eager. Checks vfuse's result against eager's first (bit for bit).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import vfuse

aten = torch.ops.aten


def _pool_backward() -> tuple[Callable, tuple[torch.Tensor, ...]]:
    x = torch.randn(8, 64, 56, 56)
    y, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    g = torch.randn_like(y)

    def backward(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    return backward, (g, x, idx)


def _embedding_backward() -> tuple[Callable, tuple[torch.Tensor, ...]]:
    g, idx = torch.randn(2, 512, 256), torch.randint(0, 50257, (2, 512))

    def backward(g: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.embedding_dense_backward(g, idx, 50257, -1, False)

    return backward, (g, idx)


def _pool_step() -> tuple[Callable, tuple[torch.Tensor, ...]]:
    x = torch.randn(8, 64, 56, 56, requires_grad=True)

    def step(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, 2, 1).sum()

    return step, (x,)


def _embedding_step() -> tuple[Callable, tuple[torch.Tensor, ...]]:
    w, idx = torch.randn(50257, 256, requires_grad=True), torch.randint(0, 50257, (2, 512))

    def step(w: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, w).square().sum()

    return step, (w,)


def _grad_of(fn: Callable) -> Callable:
    def run(*args: torch.Tensor) -> Any:
        return torch.autograd.grad(fn(*args), args)

    return run


def _contenders(name: str, fn: Callable, args: tuple, training: bool) -> dict[str, Callable]:
    torch._dynamo.reset()
    if training:
        vf = _grad_of(torch.compile(fn, backend=vfuse.backend()))
        ind = _grad_of(torch.compile(fn))
        return {"eager": _grad_of(fn), "vfuse": vf, "inductor": ind}
    return {"eager": fn, "vfuse": vfuse.compile(fn, args), "inductor": torch.compile(fn)}


def _run(name: str, make: Callable, training: bool, reps: int) -> None:
    fn, args = make()
    calls = _contenders(name, fn, args, training)
    want = calls["eager"](*args)
    for c in ("vfuse", "inductor"):
        got = calls[c](*args)
        same = all(torch.equal(a, b) for a, b in zip(got, want, strict=True)) if training else torch.equal(got, want)
        print(f"  {name}: {c} {'bit-exact' if same else 'differs'} vs eager")
    times: dict[str, list[float]] = {c: [] for c in calls}
    for _ in range(3):
        for f in calls.values():
            f(*args)
    for _ in range(reps):
        for c, f in calls.items():
            t0 = time.perf_counter()
            f(*args)
            times[c].append(time.perf_counter() - t0)
    eager = statistics.median(times["eager"])
    row = ", ".join(
        f"{c} {statistics.median(t) * 1e3:.3f} ms (min {min(t) * 1e3:.3f}; {eager / statistics.median(t):.2f}x)"
        for c, t in times.items()
    )
    print(f"{name}: {row}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    _run("max_pool2d backward 8x64x56x56 k3 s2 p1", _pool_backward, False, a.reps)
    _run("embedding backward 50257x256, 2x512 ids", _embedding_backward, False, a.reps)
    _run("max_pool2d fwd+bwd step", _pool_step, True, a.reps)
    _run("embedding fwd+bwd step", _embedding_step, True, a.reps)


if __name__ == "__main__":
    main()
