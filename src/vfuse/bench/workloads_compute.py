"""Compute-bound benchmark workloads: GEMM, convolution and attention with fused epilogues.

Unlike the memory-bound workloads in `workloads.py`, these spend most of their time in a
matmul or a convolution, so the figure of merit is time (and the ratio to eager), not
achieved bandwidth. They exist to measure what vfuse gains or loses around the heavy op:
the epilogue it fuses (GELU, folded BatchNorm + ReLU, softmax) and the intermediates it does
not write.

Factories return `(module, inputs)`; `workloads.py` wraps them into `Instance`s and registers
them (this module must not import `workloads`, which imports it). Parameters are drawn from a
seeded generator, not torch's global RNG, so every build is identical.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_SEED = 0

Built = tuple[nn.Module, tuple[Tensor, ...]]


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=gen) * scale + shift


def _linear(gen: torch.Generator, d_in: int, d_out: int) -> nn.Linear:
    # Variance-preserving weights (like nn.Linear's default scale) so activations stay O(1)
    # through a block, and a non-zero bias so a compiler that drops it fails the check.
    lin = nn.Linear(d_in, d_out)
    with torch.no_grad():
        lin.weight.copy_(_randn(gen, d_out, d_in, scale=1.0 / math.sqrt(d_in)))
        lin.bias.copy_(_randn(gen, d_out, scale=0.1))
    return lin


def _layernorm(gen: torch.Generator, dim: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(_randn(gen, dim, scale=0.1, shift=1.0))
        norm.bias.copy_(_randn(gen, dim, scale=0.1))
    return norm


# --- linear_gelu / linear_gelu_smallk: GEMM + pointwise epilogue ------------------------------


class LinearGelu(nn.Module):
    def __init__(self, gen: torch.Generator, d_in: int, d_out: int) -> None:
        super().__init__()
        self.fc = _linear(gen, d_in, d_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.fc(x))


def build_linear_gelu(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    module = LinearGelu(gen, 1024, 4096).eval()
    return module, (_randn(gen, 64 if quick else 2048, 1024),)


def build_linear_gelu_smallk(quick: bool) -> Built:
    # K = 64: little work per output, so the GEMM is close to memory-bound and writing the
    # pre-GELU intermediate (what an unfused epilogue does) costs the most here.
    gen = torch.Generator().manual_seed(_SEED)
    module = LinearGelu(gen, 64, 4096).eval()
    return module, (_randn(gen, 256 if quick else 16384, 64),)


# --- qlinear: int8 linear, dequantize prologues and quantize epilogue in one GEMM kernel -----


class QLinear(nn.Module):
    """int8 activations (per-tensor scale and zero point) times int8 weights (per-channel
    scales), GELU, then quantized back to int8: what a weight-and-activation int8 linear
    layer computes when it is written with plain torch ops."""

    def __init__(self, gen: torch.Generator, d_in: int, d_out: int) -> None:
        super().__init__()
        # Scales keep x @ w.t() O(1) (|xq - 2| * 0.02 <= 2.6, w ~ 1/sqrt(d_in)), so outputs
        # spread over the int8 range instead of saturating.
        self.register_buffer("wq", torch.randint(-128, 128, (d_out, d_in), generator=gen, dtype=torch.int8))
        self.register_buffer("ws", (0.5 + torch.rand(d_out, generator=gen)) / (74.0 * math.sqrt(d_in)))
        self.register_buffer("bias", _randn(gen, d_out, scale=0.1))

    def forward(self, xq: Tensor) -> Tensor:
        x = (xq.float() - 2.0) * 0.02
        w = self.wq.float() * self.ws[:, None]
        y = F.gelu(F.linear(x, w, self.bias))
        return torch.clamp(torch.round(y / 0.05) + 1.0, -128, 127).to(torch.int8)


def build_qlinear(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    module = QLinear(gen, 1024, 4096).eval()
    rows = 64 if quick else 2048
    return module, (torch.randint(-128, 128, (rows, 1024), generator=gen, dtype=torch.int8),)


# --- conv_bn_relu: the classic Conv-BN fold -------------------------------------------------


class ConvBnRelu(nn.Module):
    def __init__(self, gen: torch.Generator, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        fan_in = channels * 9
        with torch.no_grad():
            self.conv.weight.copy_(_randn(gen, *self.conv.weight.shape, scale=1.0 / math.sqrt(fan_in)))
            assert self.conv.bias is not None
            self.conv.bias.copy_(_randn(gen, channels, scale=0.1))
            # Non-trivial running statistics and affine terms: a fold that ignores any of
            # them (or uses batch statistics) gives a visibly different answer.
            self.bn.running_mean.copy_(_randn(gen, channels, scale=0.2))
            self.bn.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
            self.bn.weight.copy_(_randn(gen, channels, scale=0.1, shift=1.0))
            self.bn.bias.copy_(_randn(gen, channels, scale=0.1))

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)))


def build_conv_bn_relu(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    module = ConvBnRelu(gen, 64).eval()  # eval: BatchNorm uses the running statistics
    shape = (1, 64, 14, 14) if quick else (8, 64, 56, 56)
    return module, (_randn(gen, *shape),)


# --- attention: written out (not SDPA), so a compiler must find the pattern itself ----------


class Attention(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scale = q.shape[-1] ** -0.5
        return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def build_attention(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    shape = (1, 2, 128, 64) if quick else (4, 8, 1024, 64)
    return Attention(), tuple(_randn(gen, *shape) for _ in range(3))


class CausalAttention(nn.Module):
    """Written out as Hugging Face's eager attention does: a tril mask sliced to T, masked_fill(-inf)."""

    def __init__(self, max_t: int) -> None:
        super().__init__()
        tril = torch.ones(max_t, max_t, dtype=torch.bool).tril()
        self.register_buffer("causal", tril.view(1, 1, max_t, max_t), persistent=False)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        t = q.shape[-2]
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
        scores = scores.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def build_causal_attention(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    shape = (1, 2, 128, 64) if quick else (2, 12, 2048, 64)
    return CausalAttention(shape[2]), tuple(_randn(gen, *shape) for _ in range(3))


# --- gpt2_block: a whole pre-LN transformer block, HF GPT-2 style -----------------------------


class Gpt2Block(nn.Module):
    """LN -> qkv -> causal attention (written out) -> proj -> +x -> LN -> fc -> gelu(tanh) -> proj -> +x.

    The attention follows Hugging Face's eager GPT-2: scores masked with masked_fill(-inf)
    through a tril buffer sliced to T, so the causal mask is a constant a compiler can see.
    """

    def __init__(self, gen: torch.Generator, d: int, heads: int, max_t: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = _layernorm(gen, d), _layernorm(gen, d)
        self.c_attn, self.c_proj = _linear(gen, d, 3 * d), _linear(gen, d, d)
        self.c_fc, self.mlp_proj = _linear(gen, d, 4 * d), _linear(gen, 4 * d, d)
        tril = torch.ones(max_t, max_t, dtype=torch.bool).tril()
        self.register_buffer("causal", tril.view(1, 1, max_t, max_t), persistent=False)

    def _attention(self, h: Tensor) -> Tensor:
        b, t, d = h.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.c_attn(h).split(d, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        scores = scores.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self._attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def build_gpt2_block(quick: bool) -> Built:
    gen = torch.Generator().manual_seed(_SEED)
    batch, t = (1, 64) if quick else (4, 512)
    module = Gpt2Block(gen, 768, 12, max_t=t).eval()
    return module, (_randn(gen, batch, t, 768),)
