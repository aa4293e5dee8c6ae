"""amax's backward compares the maximum it stored with the value recomputed in another kernel
(`eq(amax, v)`): the two must be the same bits. With glibc's vector math declared, g++ called
libmvec in a loop's vector body and scalar libm elsewhere, which differ in the last bits, so the
mask missed the maximum and the gradient was wrong (up to 0.48 of 1; found by make fuzz on an
AVX-512 machine, session 24: gelu(gelu(linear(x))) -> amax in float64). Now libm is called as
such everywhere (codegen/cpp/prelude.py)."""

from __future__ import annotations

import pytest
import torch

import vfuse


def log_shifted(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x + 2)  # log(log(x)) would be NaN below x = 1


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (torch.sin, torch.float32),
        (torch.erf, torch.float64),
        (torch.log1p, torch.float32),
        (log_shifted, torch.float32),
        (torch.expm1, torch.float32),
    ],
)
def test_amax_of_a_recomputed_transcendental_has_eager_gradients(op, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.amax(op(op(x)).reshape(3, 1, 5), dim=2, keepdim=True)

    for _ in range(12):
        x = (torch.rand(15, generator=gen, dtype=dtype) + 0.5).requires_grad_()
        g = torch.randn(3, 1, 1, generator=gen, dtype=dtype)
        (want,) = torch.autograd.grad(f(x), (x,), g)
        torch._dynamo.reset()
        out = torch.compile(f, backend=vfuse.backend(strict=True))(x)
        (got,) = torch.autograd.grad(out, (x,), g)
        torch.testing.assert_close(got, want)
