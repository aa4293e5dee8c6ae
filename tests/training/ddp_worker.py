"""The processes of tests/training/test_ddp.py (spawned: a module importable by its name)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

WORLD = 2
STEPS = 4


class MLP(nn.Sequential):
    """1.1 MB of fp32 parameters: two gradient buckets of DDP's 1 MB (the smallest cap
    DDPOptimizer takes: its first bucket is 1 MB)."""

    def __init__(self) -> None:
        super().__init__(
            nn.Linear(24, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 5)
        )


def _train(compiled: bool, rank: int) -> tuple[list[float], dict]:
    import vfuse

    torch.manual_seed(0)  # the same initial weights on both ranks (DDP also broadcasts rank 0's)
    # The module compiled, then wrapped: Dynamo's DDPOptimizer splits its graph at the buckets.
    # (torch.compile(DDP(module)) breaks the graph in DDP's _pre_forward in this torch and
    # compiles nothing of the module.)
    module = torch.compile(MLP(), backend=vfuse.backend(strict=True)) if compiled else MLP()
    model = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    x, y = torch.randn(13, 24, generator=gen), torch.randint(0, 5, (13,), generator=gen)
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # DDPOptimizer compiles each bucket's piece with a clone of the backend: count process-wide.
    s = vfuse.stats()
    return losses, {"graphs": s.graphs, "eager_graphs": s.eager_graphs, "reference_graphs": s.reference_graphs}


def worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        eager, _ = _train(False, rank)
        torch._dynamo.reset()
        compiled, stats = _train(True, rank)
        Path(out, f"{rank}.json").write_text(json.dumps({"eager": eager, "compiled": compiled, "stats": stats}))
    finally:
        dist.destroy_process_group()
