"""Wall seconds to compile a contraction template's autotune candidates offline (no GPU needed):
one after another (as the autotuner did before) vs concurrently (`TemplateTimer.prepare`, a
thread pool). Each mode starts from an empty Triton cache.

    python benchmarks/autotune_compile.py [--workers 1,2,16] [--sm 90] [--size 1024]

The GEMMs are the GPT-2 block's three (width `size`, 4 x width MLP, bf16, 8 x 1024 tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vfuse
from vfuse.codegen.triton.autotune import TemplateTimer
from vfuse.schedule.gpu import candidates
from vfuse.schedule.kernel import ContractionKernel
from vfuse.targets import get_target


def _block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1) @ w2 + x @ w3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    import triton

    d, bf = a.size, torch.bfloat16
    args = (torch.randn(8192, d, dtype=bf), torch.randn(d, 4 * d, dtype=bf), torch.randn(4 * d, d, dtype=bf))
    args += (torch.randn(d, d, dtype=bf),)
    cache = Path(tempfile.mkdtemp(prefix="vfuse-tune-"))
    e = vfuse.compile(_block, args, backend="triton", target="h200", cache_dir=cache).compiled.executor
    target = get_target("h200")
    kernels = [
        dataclasses.replace(k, gpu=c)
        for k in e.program.kernels
        if isinstance(k, ContractionKernel)
        for c in candidates(k, target)
    ]
    out = {"templates": sum(isinstance(k, ContractionKernel) for k in e.program.kernels), "candidates": len(kernels)}
    for w in (int(x) for x in a.workers.split(",")):
        triton.knobs.cache.dir = tempfile.mkdtemp(prefix="vfuse-triton-cache-")  # every mode compiles
        timer = TemplateTimer(cache, sm=a.sm, workers=w)
        start = time.perf_counter()
        timer.prepare(kernels, e.program)
        out[f"workers_{w}_s"] = round(time.perf_counter() - start, 2)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
