"""Training steps (forward + backward, no optimizer) of Conv2d + BatchNorm + ReLU, vfuse vs eager
vs Inductor, interleaved in one run (issue 14: convolution_backward lowered to forward convs,
frontend/lower_conv_backward.py). Prints median step times and vfuse's torch fallbacks.

    .venv/bin/python benchmarks/conv_backward_bench.py [--threads 2] [--reps 15] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import vfuse

# (label, in channels, out channels, stride, input shape)
CASES = [
    ("conv3x3 s1 64->64 + BN + ReLU, 8x64x56x56", 64, 64, 1, (8, 64, 56, 56)),
    ("conv3x3 s2 64->128 + BN + ReLU, 8x64x56x56", 64, 128, 2, (8, 64, 56, 56)),
]
QUICK = [
    ("conv3x3 s1 8->8, 2x8x14x14", 8, 8, 1, (2, 8, 14, 14)),
    ("conv3x3 s2 8->16, 2x8x14x14", 8, 16, 2, (2, 8, 14, 14)),
]


def _model(cin: int, cout: int, stride: int) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU()).train()


def _step(fn: Callable, x: torch.Tensor, params: list[torch.Tensor], g: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(fn(x), [x, *params], g))


def run_case(label: str, cin: int, cout: int, stride: int, shape: tuple[int, ...], reps: int) -> None:
    model = _model(cin, cout, stride)
    x = torch.randn(shape, requires_grad=True)
    params = list(model.parameters())
    g = torch.randn_like(model(x))
    backend = vfuse.backend()
    fns = {
        "eager": model,
        "inductor": torch.compile(model, backend="inductor"),
        "vfuse": torch.compile(model, backend=backend),
    }
    want = _step(model, x, params, g)
    for name, fn in fns.items():  # warm up (compile) and check the gradients
        for _ in range(2):
            got = _step(fn, x, params, g)
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))
        print(f"  {name}: max gradient error {err:.1e} (relative to each gradient's largest)")
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(reps):  # interleaved: load drifts hit every contender alike
        for name, fn in fns.items():
            t = time.perf_counter()
            _step(fn, x, params, g)
            times[name].append(time.perf_counter() - t)
    eager = statistics.median(times["eager"])
    print(f"{label}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:9s} {med * 1e3:8.2f} ms  (min {min(ts) * 1e3:.2f})  eager/this {eager / med:.2f}x")
    print(f"  vfuse fallbacks: {dict(backend.stats['fallbacks'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", type=int, default=None, help="run only this case (0-based)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = QUICK if args.quick else CASES
    for case in cases if args.only is None else [cases[args.only]]:
        torch._dynamo.reset()
        run_case(*case, args.reps)


if __name__ == "__main__":
    main()
