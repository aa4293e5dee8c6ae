"""NaN in attention's inputs (found by the dynamic fuzzer with 4-piece cats, session 10): a key with a NaN makes
every score in its column NaN, so eager's softmax rows, and the outputs, are NaN; the generated attention kernel
drops the NaN score and returns finite values there. A silent difference on NaN inputs, kept here as a strict
xfail until the kernel propagates NaN scores (codegen/cpp/attention)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse


@pytest.mark.xfail(strict=True, reason="attention kernel drops NaN scores (see module docstring)")
def test_a_nan_key_makes_the_outputs_nan_as_in_eager() -> None:
    def f(c: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(c, c, c, scale=0.3)

    c = torch.randn(1, 3, 4, 2, generator=torch.Generator().manual_seed(0))
    c[0, 1, 1, 0] = float("nan")
    torch._dynamo.reset()
    got, want = torch.compile(f, backend=vfuse.backend(strict=True))(c), f(c)
    assert torch.equal(got.isnan(), want.isnan())
