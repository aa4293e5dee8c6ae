"""A GEMM group with several outputs laid out like its product (`ContractionKernel.stores`): every
value is stored once from the output tile, against eager; no second kernel re-reads the product."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.schedule.kernel import ContractionKernel


def _linear_and_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x @ w.t() + b
    return y, F.gelu(y)


def _raw_relu_and_half(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.matmul(a, b)
    return torch.relu(y), y, (y * 0.5).to(torch.bfloat16)


def _program_kernels(compiled) -> list:
    return [k for step in compiled.compiled.executor.program.steps for k in getattr(step, "kernels", ())]


@pytest.mark.parametrize(
    ("fn", "shapes", "stored"),
    [
        (_linear_and_gelu, ((67, 37), (53, 37), (53,)), 2),
        (_linear_and_gelu, ((3, 1, 29), (41, 29), (41,)), 2),  # a 3-D input with a size-1 dim
        (_raw_relu_and_half, ((2, 31, 17), (2, 17, 43)), 3),  # batched; the raw product; a bf16 cast
    ],
)
def test_every_output_is_stored_by_the_gemm(fn, shapes, stored: int) -> None:
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    compiled = vfuse.compile(fn, inputs)
    for got, want in zip(compiled(*inputs), fn(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    kernels = _program_kernels(compiled)
    gemms = [k for k in kernels if isinstance(k, ContractionKernel)]
    assert len(kernels) == 1 and len(gemms[0].written) == stored
