"""Backward ops lowered to IR instead of torch fallbacks: nll_loss's forward and backward
(cross-entropy's second half), checked against eager's loss and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse

CASES = [
    # (logits shape, target, reduction, ignore_index)
    ((5, 7), [1, 0, 6, 3, 3], "mean", -100),
    ((5, 7), [1, -100, 6, 3, -100], "mean", -100),  # ignored rows do not count in the mean
    ((5, 7), [1, 2, 6, 3, 2], "sum", 2),
    ((4, 1009), [1008, 0, 17, 5], "none", -100),
    ((11,), 4, "mean", -100),  # one sample, no batch dim
]


@pytest.mark.parametrize(
    ("shape", "target", "reduction", "ignore", "dtype"),
    [(*c, torch.float64) for c in CASES] + [(*CASES[1], torch.float32)],
)
def test_cross_entropy_forward_and_backward_without_fallback(shape, target, reduction, ignore, dtype) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    t = torch.tensor(target)
    weight = torch.randn(shape[0] if reduction == "none" else (), dtype=dtype)  # a non-trivial grad_output

    def loss(x: torch.Tensor) -> torch.Tensor:
        return (F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore) * weight).sum()

    backend = vfuse.backend(strict=True)
    got = torch.compile(loss, backend=backend)(x)
    (grad,) = torch.autograd.grad(got, x)
    want = loss(x)
    (want_grad,) = torch.autograd.grad(want, x)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(grad, want_grad, **tol)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats


def test_class_weights_still_run_through_torch() -> None:
    torch._dynamo.reset()
    x = torch.randn(3, 4, requires_grad=True)
    w, t = torch.rand(4), torch.tensor([0, 3, 1])
    backend = vfuse.backend()
    got = torch.compile(lambda x: F.cross_entropy(x, t, weight=w), backend=backend)(x)
    torch.testing.assert_close(got, F.cross_entropy(x, t, weight=w))
    assert backend.stats["fallbacks"]["aten.nll_loss_forward.default"] == 1


@pytest.mark.parametrize(
    ("shape", "k", "dtype"),
    [((2, 3, 8, 6), 2, torch.float32), ((1, 2, 9, 9), 3, torch.float64), ((3, 4, 10), 2, torch.float32)],
)
def test_avg_pool2d_tiling_windows_forward_and_backward(shape, k, dtype) -> None:
    """Windows that tile the input (kernel == stride, no padding): a two-axis row sum forward,
    eager's grad / (k*k) spread over each window backward (bit for bit)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    g = torch.randn(F.avg_pool2d(x, k).shape, dtype=dtype)
    backend = vfuse.backend(strict=True)
    got = torch.compile(lambda x: F.avg_pool2d(x, k), backend=backend)(x)
    (grad,) = torch.autograd.grad(got, x, g)
    want = F.avg_pool2d(x, k)
    (want_grad,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(got, want)  # the window's sum in another order: an ulp or so
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


def test_overlapping_avg_pool2d_still_runs_through_torch() -> None:
    torch._dynamo.reset()
    x = torch.randn(1, 2, 9, 9, requires_grad=True)
    backend = vfuse.backend()
    got = torch.compile(lambda x: F.avg_pool2d(x, 3, stride=2), backend=backend)(x)
    torch.testing.assert_close(got, F.avg_pool2d(x, 3, stride=2))
    assert backend.stats["fallbacks"]["aten.avg_pool2d.default"] == 1
