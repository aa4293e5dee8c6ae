"""Every seed pattern of the brief runs as exactly the kernels the planner planned: one generated
kernel, no torch call, one native call, and the result equals eager; vfuse.explain reports the same."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.models.zoo import randomize_bn_stats
from torch import nn

import vfuse


class RmsSilu(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w)


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def dequant_gelu_quant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 per-channel dequantize -> GELU -> per-tensor quantize (round half even, saturate)."""
    x = (q.float() - 3.0) * scale
    y = F.gelu(x)
    return torch.clamp(torch.round(y / 0.05) + 3.0, -128, 127).to(torch.int8)


PATTERNS: dict[str, tuple[Callable, Callable[[], tuple]]] = {
    "add_relu_mul": (lambda x, y: torch.relu(x + y) * y, lambda: (torch.randn(64, 96), torch.randn(64, 96))),
    "layer_norm": (nn.LayerNorm(96), lambda: (torch.randn(64, 96),)),
    "layer_norm_scale_bias": (
        lambda x, s, b: F.layer_norm(x, (96,)) * s + b,
        lambda: (torch.randn(64, 96), torch.randn(96), torch.randn(96)),
    ),
    "rms_norm_silu": (RmsSilu(96), lambda: (torch.randn(64, 96),)),
    "linear_gelu": (nn.Sequential(nn.Linear(48, 80), nn.GELU()), lambda: (torch.randn(40, 48),)),
    "conv_bn_relu": (randomize_bn_stats(ConvBnRelu()), lambda: (torch.randn(2, 8, 12, 12),)),
    "attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: tuple(torch.randn(2, 4, 32, 16) for _ in range(3)),
    ),
    "gelu_residual": (lambda x, r: F.gelu(x) + r, lambda: (torch.randn(64, 96), torch.randn(64, 96))),
    "dequant_quant": (
        dequant_gelu_quant,
        lambda: (torch.randint(-128, 128, (64, 96), dtype=torch.int8), torch.rand(96) * 0.1),
    ),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_seed_pattern_is_one_generated_kernel(name: str) -> None:
    fn, make = PATTERNS[name]
    torch.manual_seed(0)
    inputs = make()
    if isinstance(fn, nn.Module):
        fn.eval()
    backend = vfuse.backend(strict=True, freeze=True)
    with torch.no_grad():
        expected = fn(*inputs)
        got = torch.compile(fn, backend=backend)(*inputs)
    if expected.dtype == torch.int8:
        assert (got.int() - expected.int()).abs().max() <= 1  # rounding of a 1e-7-different GELU
    else:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    (compiled,) = backend.compiled
    assert len(compiled.plan.groups) == 1, f"planned {len(compiled.plan.groups)} kernels"
    stats = compiled.stats
    assert (stats.backend, stats.kernels, stats.native_calls, stats.torch_calls) == ("cpp", 1, 1, 0)
    report = vfuse.explain(fn, *inputs, freeze=True)
    assert (report.num_kernels, report.native_calls, report.torch_calls) == (1, 1, 0)


def test_gelu_dropout_residual_is_one_kernel_with_real_dropout() -> None:
    """Training-mode dropout draws its mask inside the fused kernel: every element is either the
    residual alone (dropped) or gelu(x)/(1-p) + r (kept), and about 1-p of them are kept."""
    x, r = torch.randn(256, 384), torch.randn(256, 384)
    backend = vfuse.backend(strict=True)
    with torch.no_grad():
        got = torch.compile(lambda x, r: F.dropout(F.gelu(x), 0.25, training=True) + r, backend=backend)(x, r)
    kept = torch.isclose(got, F.gelu(x) / 0.75 + r, rtol=1e-5, atol=1e-6)
    dropped = got == r
    assert bool((kept | dropped).all())
    rate = kept.float().mean().item()
    se = (0.75 * 0.25 / got.numel()) ** 0.5
    assert abs(rate - 0.75) < 5 * se
    (compiled,) = backend.compiled
    assert len(compiled.plan.groups) == 1 and compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0
