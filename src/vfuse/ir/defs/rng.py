"""vfuse's counter-based RNG, the reference every code generator reproduces bit for bit.

A random number is a pure function of (seed, stream, element index), so a fused kernel can
draw it anywhere, in any order, on any number of threads, and get the same mask. The mixer is
the `lowbias32` integer hash (Chris Wellons' hash-prospector), applied twice; it is computed
here in int64 arithmetic masked to 32 bits, which a C++ or Triton kernel can mirror with uint32.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def uniform(seed: int | torch.Tensor, stream: int, numel: int) -> torch.Tensor:
    """numel floats in [0, 1) with 24 random bits each (exact in fp32)."""
    seed = int(seed)
    key = mix32(torch.tensor([(seed + stream * GOLDEN) & MASK32], dtype=torch.int64))
    key_hi = mix32(torch.tensor([((seed >> 32) ^ stream) & MASK32], dtype=torch.int64))
    idx = torch.arange(numel, dtype=torch.int64)
    h = mix32((idx & MASK32) ^ key)
    h = mix32(h ^ (idx >> 32) ^ key_hi)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))
