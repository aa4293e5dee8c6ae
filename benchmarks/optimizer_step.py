"""Step time of a compiled optimizer step: eager, Inductor and vfuse, interleaved.

    .venv/bin/python benchmarks/optimizer_step.py [--threads 2] [--reps 15] [--case large|small|all]
        [--optimizer adamw|sgd] [--foreach]

`torch.compile(lambda: opt.step(), backend=...)` around the same optimizer on the same parameter
set (its gradients set once), the contenders timed round-robin (`vfuse.bench.timing.measure`);
medians. Cases: `large`, 40 parameters of 3.3 M fp32 values (10 x 256x256, 20 x 256, 10 x
1024x256); `small`, 120 parameters (96 x 64, 24 x 64x64). Parameters and state change every
step, so each contender keeps its own copies.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import vfuse
from vfuse.bench.timing import TimingConfig, measure

CASES = {
    "large": [(256, 256)] * 10 + [(256,)] * 20 + [(1024, 256)] * 10,
    "small": [(64,)] * 96 + [(64, 64)] * 24,
}


def make_step(shapes: list[tuple[int, ...]], optimizer: str, foreach: bool, backend: str | None) -> Callable[[], None]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape)
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
    else:
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, weight_decay=0.01, foreach=foreach)
    if backend is None:
        return opt.step
    backend_fn = vfuse.backend(strict=True) if backend == "vfuse" else backend
    return torch.compile(lambda: opt.step(), backend=backend_fn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--foreach", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for case in CASES if args.case == "all" else [args.case]:
        torch._dynamo.reset()
        steps = {
            name: make_step(CASES[case], args.optimizer, args.foreach, backend)
            for name, backend in (("eager", None), ("inductor", "inductor"), ("vfuse", "vfuse"))
        }
        for step in steps.values():  # compile outside the clock
            step()
        stats = measure(steps, TimingConfig(3, args.reps, 0.02))
        line = ", ".join(f"{k} {s.median_s * 1e3:.2f} ms" for k, s in stats.items())
        print(f"{case} ({args.optimizer}, foreach={args.foreach}, {args.threads} threads): {line}", flush=True)


if __name__ == "__main__":
    main()
