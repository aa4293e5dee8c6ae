"""Small models for training-numerics tests: each written the way users write it, sized to compile fast."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import vfuse


class ConvBN(nn.Sequential):
    """The issue's reproducer: a bias-free conv straight into a training-mode BatchNorm."""

    def __init__(self, cin: int = 8, cout: int = 16) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))


class ResBlock(nn.Module):
    """ResNet basic block with an identity shortcut: (conv-BN-ReLU) x2 + residual."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class MobileBlock(nn.Module):
    """MobileNetV2 inverted residual: 1x1 expand, depthwise 3x3 (groups=C), 1x1 project, BN + ReLU6."""

    def __init__(self, c: int = 8, expand: int = 2) -> None:
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.dw(self.expand(x)))


class TransformerBlock(nn.Module):
    """Pre-LN block: attention through SDPA or a hand-written softmax, dropout, GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4, dropout: float = 0.0, sdpa: bool = True) -> None:
        super().__init__()
        self.heads, self.sdpa, self.p = heads, sdpa, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        else:
            att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
            y = self.drop(att.softmax(dim=-1)) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attention(self.ln1(x)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class RMSNormMLP(nn.Module):
    """nn.RMSNorm and a hand-written RMSNorm around a SiLU MLP."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.scale = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.fc2(F.silu(self.fc1(self.norm(x))))
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale


class GroupNormNet(nn.Module):
    """Conv, GroupNorm (several channels per group), SiLU, then GroupNorm with one channel per group."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.gn1, self.gn2 = nn.GroupNorm(4, 2 * c), nn.GroupNorm(2 * c, 2 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn2(F.silu(self.gn1(self.conv(x))))


class EmbedClassifier(nn.Module):
    """Token embedding, mean over tokens, linear head; the loss (cross-entropy) is part of forward."""

    def __init__(self, vocab: int = 37, d: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(tokens).mean(1))
        return F.cross_entropy(logits, labels, label_smoothing=0.1)


class DropoutProbe(nn.Module):
    """dropout(x * w): with x all ones, every output is 0 or w / (1 - p), and w's gradient shows the mask."""

    def __init__(self, n: int, p: float) -> None:
        super().__init__()
        self.w, self.p = nn.Parameter(torch.rand(n) + 0.5), p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x * self.w, self.p)


class QkvAttention(nn.Module):
    """qkv projection, causal SDPA, output projection (the bench's sdpa_attention)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Perturb every parameter and give BatchNorms non-trivial running statistics, so that a
    gradient or statistic that ignores a term would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d) and m.track_running_stats:
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def _scale(t: torch.Tensor) -> float:
    return t.abs().max().item() if t.numel() and t.is_floating_point() else 1.0


def _close(got: torch.Tensor, expected: torch.Tensor, tol: float, what: str, floor: float = 1e-30) -> None:
    """Relative to the tensor's scale (gradients of different parameters differ by orders of
    magnitude), but at least `floor`: a gradient that is zero in exact arithmetic (a bias before
    a norm) is rounding noise of the scale of the others."""
    atol = tol * max(_scale(expected), floor)
    torch.testing.assert_close(got, expected, rtol=tol, atol=atol, msg=lambda m: f"{what}: {m}")


def check_training_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], tol: float, backend: Callable, steps: int = 2
) -> None:
    """`steps` forward+backward passes of `model` compiled with `backend` against an eager copy:
    outputs, every parameter's gradient (accumulated over the steps) and every buffer (BatchNorm
    running statistics) must match. Later steps reuse the compiled graphs on updated buffers."""
    model.zero_grad(set_to_none=True)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    for step in range(steps):
        got, expected = compiled(*inputs), ref(*inputs)
        _close(got, expected, tol, f"step {step} output")
        weight = torch.randn(expected.shape, generator=torch.Generator().manual_seed(step), dtype=expected.dtype)
        (got * weight).sum().backward()
        (expected * weight).sum().backward()
    floor = 1e-2 * max((_scale(q.grad) for q in ref.parameters() if q.grad is not None), default=0.0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), f"gradient of {name}: {p.grad} vs {q.grad}"
        if q.grad is not None:
            _close(p.grad, q.grad, tol, f"gradient of {name}", floor)
    for (name, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):
        _close(b, c, tol, f"buffer {name}")


def directional_derivatives(model: nn.Module, x: torch.Tensor, eps: float = 1e-5) -> tuple[float, float]:
    """d/dt L(params + t v) at t=0 for a random direction v and L = sum(out * weight), from the
    compiled backward and from central differences of the compiled forward. Every call reseeds
    torch, so random ops draw the same values each time: the two must agree for any dropout mask."""
    compiled = torch.compile(model, backend=vfuse.backend(strict=True))
    params = list(model.parameters())
    directions = [torch.randn_like(p) for p in params]

    def loss(weight: torch.Tensor | None = None) -> torch.Tensor:
        torch.manual_seed(1234)
        out = compiled(x)
        return out if weight is None else (out * weight).sum()

    weight = torch.randn(loss().shape, dtype=x.dtype)
    loss(weight).backward()
    analytic = sum((p.grad * v).sum() for p, v in zip(params, directions, strict=True)).item()
    values = []
    with torch.no_grad():
        for sign in (1.0, -1.0):
            for p, v in zip(params, directions, strict=True):
                p.add_(v, alpha=sign * eps)
            values.append(loss(weight).item())
            for p, v in zip(params, directions, strict=True):
                p.sub_(v, alpha=sign * eps)
    return analytic, (values[0] - values[1]) / (2 * eps)


def fix_typical_target(monkeypatch: Any) -> None:
    """Save or recompute and the planner follow the target's figures, which this machine measures
    (and which move with the load): tests whose structure depends on them decide with fixed,
    typical ones: 20 GB/s DRAM, 100 G flop/s vector."""
    import dataclasses

    from vfuse.entry.capture import VfuseBackend
    from vfuse.targets import get_target

    fixed = dataclasses.replace(get_target("cpu"), dram_bw=20e9, vector_f32=100e9, transcendental_f32=0.0)
    monkeypatch.setattr(VfuseBackend, "_target", lambda self: fixed)
