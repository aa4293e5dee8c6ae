"""Golden printed IR of the seed patterns, after lowering and optimization.

The expected text lives in tests/frontend/golden/<pattern>.txt (canonical value names, so FX naming
does not matter). After an intended lowering change, regenerate with VFUSE_UPDATE_GOLDEN=1 and
review the diff: it is the exact IR every later stage sees.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vfuse.context import Context
from vfuse.entry.aot import to_ir
from vfuse.interp import run
from vfuse.ir import format_graph, verify

GOLDEN = Path(__file__).parent / "golden"


class ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class RmsSilu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y) * 0.5


PATTERNS = {
    "elementwise_chain": (chain, lambda: (torch.randn(4, 8), torch.randn(4, 8))),
    "layer_norm": (torch.nn.LayerNorm(8), lambda: (torch.randn(4, 8),)),
    "rms_norm_silu": (RmsSilu(), lambda: (torch.randn(4, 8),)),
    "linear_gelu": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()), lambda: (torch.randn(4, 8),)),
    "conv_bn_relu": (ConvBnRelu().eval(), lambda: (torch.randn(1, 3, 6, 6),)),
    "attention": (attention, lambda: tuple(torch.randn(1, 2, 4, 8) for _ in range(3))),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_seed_pattern_ir(name: str) -> None:
    fn, make_inputs = PATTERNS[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    with torch.no_grad():
        graph = verify(to_ir(fn, inputs, Context()))
        text = format_graph(graph, canonical=True)
        path = GOLDEN / f"{name}.txt"
        if os.environ.get("VFUSE_UPDATE_GOLDEN"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(text + "\n")
        assert text + "\n" == path.read_text(), f"IR of {name} changed; see VFUSE_UPDATE_GOLDEN in this file"
        # The golden IR is also right: run it against eager.
        params = [p for p in fn.parameters()] + [b for b in fn.buffers()] if isinstance(fn, torch.nn.Module) else []
        (out,) = run(graph, [*params, *inputs])
        torch.testing.assert_close(out, fn(*inputs), rtol=1e-5, atol=1e-6)
