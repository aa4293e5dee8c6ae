"""NaN in attention's inputs (found by the dynamic fuzzer with 4-piece cats, session 10): a NaN score makes its
softmax row NaN. The generated kernel used to drop NaN scores (its exp clamped NaN to 0) and returned finite
values there. Compared with the definition, softmax(masked_fill(q k^T s, ~keep, -inf)) v: eager's CPU flash kernel
returns 0 in some columns of an all-NaN row (a query with a NaN), which no formula gives, and torch's math backend
adds the causal mask as -inf, so a NaN score that the mask hides still poisons its row. Every NaN that eager's flash
kernel returns, we return too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse


def _definition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) * 0.3
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(-1) @ v


def _inputs(where: str, causal: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=g) for _ in range(3))
    {"q": q, "k": k, "v": v}[where][1, 2, 5, 3] = float("nan")
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_a_nan_input_gives_nan_where_the_definition_does(where: str, causal: bool) -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3)

    q, k, v = _inputs(where, causal)
    torch._dynamo.reset()
    got = torch.compile(f, backend=vfuse.backend(strict=True))(q, k, v)
    want = _definition(q, k, v, causal)
    assert want.isnan().any()
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert not (f(q, k, v).isnan() & ~got.isnan()).any()


@pytest.mark.parametrize("where", ["k", "v"])
def test_nan_gradients_land_where_the_math_backward_puts_them(where: str) -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=0.3)

    base = _inputs(where, False)
    mine = [t.clone().requires_grad_() for t in base]
    ref = [t.clone().requires_grad_() for t in base]
    torch._dynamo.reset()
    torch.compile(f, backend=vfuse.backend(strict=True))(*mine).square().sum().backward()
    _definition(*ref, causal=False).square().sum().backward()
    for a, b in zip(mine, ref):
        assert torch.equal(a.grad.isnan(), b.grad.isnan())
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True, rtol=1e-4, atol=1e-4)
