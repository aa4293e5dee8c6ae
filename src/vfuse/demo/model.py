"""The demo's built-in model: a pre-LN GPT-2-style transformer block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):
    """LayerNorm -> causal self-attention -> residual; LayerNorm -> Linear-GELU-Linear -> residual."""

    def __init__(self, d: int = 256, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def example(batch: int = 4, tokens: int = 128, d: int = 256, heads: int = 8) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TransformerBlock(d, heads).eval(), torch.randn(batch, tokens, d)


def factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """For the command line: `vfuse explain vfuse.demo.model:factory`."""
    model, x = example()
    return model, (x,)
