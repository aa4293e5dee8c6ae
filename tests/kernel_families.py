"""One small graph per kernel family (pointwise, row reductions, column and multi-axis reductions,
gathers, integer division, casts, random numbers), shared by the tests that run every family on
another instruction set: ARM64 under qemu, and every tier of this CPU."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vfuse.targets.cpu import machine_flags
from vfuse.targets.isa import Isa, machine_arch, missing_flags

FAMILIES: dict[str, tuple[Callable, tuple[torch.Tensor, ...]]] = {
    "pointwise": (lambda x, y: torch.relu(x + y) * torch.sigmoid(y), (torch.randn(37, 41), torch.randn(41))),
    "layernorm_gelu": (
        lambda x, w, b: F.gelu(F.layer_norm(x, (200,), w, b)),
        (torch.randn(13, 200), torch.randn(200), torch.randn(200)),
    ),
    "rmsnorm_silu": (lambda x, w: F.silu(F.rms_norm(x, (96,), w)), (torch.randn(9, 96), torch.randn(96))),
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(11, 300),)),
    "column_sum": (lambda x: x.sum(0), (torch.randn(257, 33),)),
    "view_multiaxis": (lambda x: x.view(2, 4, 4, 36).sum((2, 3)), (torch.randn(2, 16, 6, 6),)),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(10, 24), torch.tensor([[0, 9, 3], [1, 1, 7]]))),
    "int_division": (lambda a, b: a // b + a % b, (torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,)))),
    "casts_bf16": (lambda x: (x.to(torch.bfloat16) * 3).float().exp(), (torch.randn(5, 70),)),
    "dropout": (lambda x: F.dropout(x, 0.3, training=True) + 1, (torch.randn(1000),)),
}
# Families whose result depends on the random stream: compared with the reference executor
# under the same seed rather than with eager torch (whose stream differs).
RANDOM = frozenset({"dropout"})


def tiers_here() -> list[Isa]:
    """Every instruction-set tier this CPU runs, lowest first; `VFUSE_TEST_ISA=generic,avx2` narrows it."""
    flags, arch = machine_flags(), machine_arch()
    tiers = [t for t in Isa if not missing_flags(t, flags, arch)]
    chosen = os.environ.get("VFUSE_TEST_ISA")
    return [t for t in tiers if t.value in chosen.lower().split(",")] if chosen else tiers
