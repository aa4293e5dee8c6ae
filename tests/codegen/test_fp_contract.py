"""Kernels round as eager does: no FMA contraction outside the GEMM/conv/attention templates. A
contracted `x*x - sum(x*x)` over one element was x*x's rounding error, not 0, so the variance of one
element came out inf instead of NaN (found by tests/test_random_graphs.py)."""

from __future__ import annotations

import torch

import vfuse


def test_a_product_minus_its_own_sum_is_exactly_zero() -> None:
    fn = lambda x: (x * x) - (x * x).sum(0, keepdim=True)  # noqa: E731
    x = torch.randn(1, 257) * 3
    assert torch.equal(vfuse.compile(fn, (x,))(x), torch.zeros(1, 257))


def test_variance_of_one_element_is_nan_as_eager() -> None:
    fn = lambda x: (x * x) - (x * x).var(0, keepdim=True)  # noqa: E731
    x = torch.randn(1, 33)
    got = vfuse.compile(fn, (x,))(x)
    assert got.isnan().all(), got


def test_the_templates_still_use_fma() -> None:
    """The GEMM micro-kernel's `a * b + c` is contracted where contraction is switched back on."""
    fn = lambda a, b: torch.relu(a @ b)  # noqa: E731
    a, b = torch.randn(64, 96), torch.randn(96, 80)
    compiled = vfuse.compile(fn, (a, b))
    torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=1e-4, atol=1e-4)
    source = compiled.compiled.executor.source
    assert source.count('#pragma GCC optimize("fp-contract=fast")') == source.count("#pragma GCC pop_options") >= 1
