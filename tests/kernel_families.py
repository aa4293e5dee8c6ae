"""One small graph per kernel family (pointwise, row reductions, column and multi-axis reductions,
gathers, integer division, casts, random numbers, transposed operands; GEMM, conv, flash attention, quantized GEMM and
byte lookup tables in CONTRACTIONS), shared by the tests that run every family on
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
    "logsumexp_all": (lambda x: x.logsumexp((0, 1, 2)), (torch.randn(1, 1, 131),)),
    "column_sum": (lambda x: x.sum(0), (torch.randn(257, 33),)),
    "view_multiaxis": (lambda x: x.view(2, 4, 4, 36).sum((2, 3)), (torch.randn(2, 16, 6, 6),)),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(10, 24), torch.tensor([[0, 9, 3], [1, 1, 7]]))),
    "int_division": (lambda a, b: a // b + a % b, (torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,)))),
    "casts_bf16": (lambda x: (x.to(torch.bfloat16) * 3).float().exp(), (torch.randn(5, 70),)),
    "dropout": (lambda x: F.dropout(x, 0.3, training=True) + 1, (torch.randn(1000),)),
    # Saturated GELU: exactly 0 and x beyond |x| = 5.6, also without FMA (the generic tier).
    "gelu_saturated": (F.gelu, (torch.cat([torch.tensor([-1e30, -100.0, -5.6, 5.6, 100.0, 1e30]), torch.randn(61)]),)),
}


def _qlinear(xq: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """int8 dequantize -> linear + bias -> relu -> quantize, as the qlinear benchmark (relu for gelu).
    Power-of-two scales keep every product and sum exact in fp32 whatever the summation order, so
    the int8 result is the same on every tier (a rounding tie flips with the order otherwise)."""
    x = (xq.float() - 2.0) * 0.0625
    w = wq.float() * ws[:, None]
    y = torch.relu(F.linear(x, w, bias))
    return torch.clamp(torch.round(y * 8.0) + 1.0, -128, 127).to(torch.int8)


def _byte_table(q: torch.Tensor) -> torch.Tensor:
    """int8 dequantize -> gelu -> quantize (the dequant_quant benchmark): a 256-entry lookup table."""
    y = torch.round(F.gelu((q.float() - 3) * 0.05) / 0.04) - 5
    return torch.clamp(y, -128, 127).to(torch.int8)


_G = torch.Generator().manual_seed(12)


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_G)


def _int8(*shape: int) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=_G, dtype=torch.int8)


_KEEP = torch.rand(19, 23, generator=_G) > 0.3
_KEEP[..., 0] = True  # no row without a key (eager gives NaN there, vfuse zeros: docs/semantics.md)

# The hand-written families (GEMM, conv, flash attention, quantized GEMM, byte tables): odd sizes
# pad every register tile; head size 20 is not whole vectors on x86 (DV != D, torch decomposes SDPA).
CONTRACTIONS: dict[str, tuple[Callable, tuple[torch.Tensor, ...]]] = {
    "linear_bias_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), (_rand(19, 40), _rand(37, 40), _rand(37))),
    "linear_small_k": (lambda x, w: torch.relu(F.linear(x, w)), (_rand(50, 5), _rand(24, 5))),
    "batched_matmul": (lambda a, b: torch.matmul(a, b) * 0.5, (_rand(3, 13, 17), _rand(3, 17, 29))),
    "conv3x3": (
        lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)),
        (_rand(2, 5, 9, 11), _rand(7, 5, 3, 3), _rand(7)),
    ),
    "conv3x3_stride2_groups": (
        lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=2) + 1,
        (_rand(1, 6, 10, 9), _rand(4, 3, 3, 3)),
    ),
    "attention_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (_rand(1, 2, 21, 20), _rand(1, 2, 21, 20), _rand(1, 2, 21, 20)),
    ),
    "attention_masked": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (_rand(1, 2, 19, 8), _rand(1, 2, 23, 8), _rand(1, 2, 23, 8), _KEEP),
    ),
    "qlinear": (
        _qlinear,
        (
            _int8(9, 24),
            _int8(13, 24),
            2.0 ** -torch.randint(6, 9, (13,), generator=_G),
            torch.randint(-64, 64, (13,), generator=_G) / 64,
        ),
    ),
    "byte_table": (_byte_table, (torch.arange(-128, 128, dtype=torch.int8).repeat(3),)),
}
FAMILIES |= CONTRACTIONS
# Operands contiguous along different axes: 2-D tiles with the transposed loads staged through L1
# (schedule/transpose.py), odd sizes so every tile edge and register block has a tail.
FAMILIES |= {
    "transpose_chain": (lambda x, y: torch.relu(x.t() + y) * torch.sigmoid(y), (_rand(131, 67), _rand(67, 131))),
    "permute_nchw_nhwc": (lambda x, y: x.permute(0, 2, 3, 1) * 0.5 + y, (_rand(2, 7, 17, 19), _rand(2, 17, 19, 7))),
    "transpose_bf16": (
        lambda x, b: (x.t() * 3 + b).float(),
        (_rand(97, 61).to(torch.bfloat16), _rand(61, 1).to(torch.bfloat16)),
    ),
    "transpose_int32": (
        lambda x, y: x.t() * 3 - y,
        (
            torch.randint(-99, 99, (89, 53), generator=_G, dtype=torch.int32),
            torch.randint(-99, 99, (53, 89), generator=_G, dtype=torch.int32),
        ),
    ),
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
