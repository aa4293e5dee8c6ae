"""Training dropout whose mask is a pure function of one saved seed, so the backward recomputes it.

AOTAutograd's joint graph keeps `native_dropout`'s boolean mask for the backward. This
decomposition draws one int64 seed from torch's generator (randint: 8 bytes) and derives the mask
from (seed, element index) with vfuse's counter-based hash (`ir/defs/rng.py`, stream 0: the same
numbers vfuse's RAND gives for that seed), written in ATen integer ops. The partitioner
(`entry/remat.py`) then keeps the seed and recomputes the mask in the backward. Only used for
graphs that need gradients (capture.py); inference keeps the native RAND lowering. The seeds' randint
draws lower to RNG_SEED nodes (frontend/lower_random.lower_seed_draw): the same value, no torch fallback.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from vfuse.frontend import attention_ops  # noqa: F401  (defines torch.ops.vfuse.flash_attention_dropout)
from vfuse.ir.defs.random import SEED_HIGH
from vfuse.ir.defs.rng import GOLDEN, MASK32

aten = torch.ops.aten


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    # x >= 0 here, so floor division is the right shift (vfuse lowers no shift op).
    return torch.floor_divide(x, 1 << bits)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32, as `ir.defs.rng.mix32` (int64 products wrap; the low 32 bits are kept)."""
    x = torch.bitwise_xor(x, _shr(x, 16))
    x = torch.bitwise_and(x * 0x7FEB352D, MASK32)
    x = torch.bitwise_xor(x, _shr(x, 15))
    x = torch.bitwise_and(x * 0x846CA68B, MASK32)
    return torch.bitwise_xor(x, _shr(x, 16))


def uniform(seed: torch.Tensor, shape: torch.Size, stream: int = 0) -> torch.Tensor:
    """float32 in [0, 1) of `shape`: `ir.defs.rng.uniform(seed, stream, numel)` with a tensor seed."""
    numel = shape.numel()
    key = _mix32(torch.bitwise_and(seed + stream * GOLDEN, MASK32))
    key_hi = _mix32(torch.bitwise_and(torch.bitwise_xor(_shr(seed, 32), stream), MASK32))
    idx = torch.arange(numel, dtype=torch.int64)
    h = _mix32(torch.bitwise_xor(torch.bitwise_and(idx, MASK32), key))
    high = torch.bitwise_xor(_shr(idx, 32), key_hi) if numel > MASK32 else key_hi
    h = _mix32(torch.bitwise_xor(h, high))
    return (_shr(h, 8).to(torch.float32) * (1.0 / (1 << 24))).view(shape)


# Per trace (keyed by make_fx's proxy mode): the graph's one seed and the next stream number.
_TRACES: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _seed_and_stream() -> tuple[torch.Tensor, int]:
    """One seed per graph, drawn as RNG_SEED draws it, and streams 0, 1, ... in trace order: the
    frontend's numbering, so a graph traced without gradients (RAND lowering) draws the same masks."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    state = _TRACES.get(mode) if mode is not None else None
    if state is None:
        state = [torch.randint(0, SEED_HIGH, (), dtype=torch.int64), 0]
        if mode is not None:
            _TRACES[mode] = state
    state[1] += 1
    return state[0], state[1] - 1


def seeded_native_dropout(x: torch.Tensor, p: float, train: bool | None) -> Any:
    """aten.native_dropout with the mask drawn from a saved seed (train mode, 0 < p < 1)."""
    if not train or not 0.0 < p < 1.0 or x.is_cuda:
        return NotImplemented  # the native lowering handles these
    seed, stream = _seed_and_stream()
    keep = uniform(seed, x.shape, stream) >= p
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p)), keep


DECOMPOSITIONS = {aten.native_dropout.default: seeded_native_dropout}


def attention_dropout(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` with dropout (train mode) as vfuse's op pair
    (frontend/attention_ops.py), whose mask is a pure function of a seed drawn here from torch's
    generator: the backward keeps 8 bytes, not the N x N mask (entry/attention_rewrite.py)."""
    del enable_gqa  # the op groups query heads over fewer key heads by itself
    # A seed of its own (stream 0), not the graph's: this runs above AOTAutograd's functionalization,
    # the dropout decomposition below it, and a tensor of one layer cannot be used in the other.
    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64)
    flash = torch.ops.vfuse.flash_attention_dropout
    out, _ = flash(query, key, value, attn_mask, seed, dropout_p, is_causal, scale, 0)
    return out
