"""max_pool2d in training under dynamic=True: the forward with indices (taps at run-time offsets,
their positions an iota over a run-time width) and its SCATTER_ADD backward compile once for every
size of a parity class; values, indices and gradients are eager's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import vfuse


def test_max_pool_training_compiles_once_for_every_odd_size() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    fn = torch.compile(lambda x: F.max_pool2d(x, 3, 2, 1) * 2, backend=backend, dynamic=True)
    for n in (9, 13, 17, 23):
        x = torch.randn(2, 3, n, n).round().requires_grad_()  # rounded: ties take the first tap
        y = fn(x)
        (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
        ref = x.detach().requires_grad_()
        want = F.max_pool2d(ref, 3, 2, 1) * 2
        (want_grad,) = torch.autograd.grad(want, ref, torch.ones_like(want))
        assert torch.equal(y, want) and torch.equal(grad, want_grad)
    assert backend.stats["graphs"] == 2, backend.stats  # one forward, one backward
    assert not backend.stats["fallbacks"], backend.stats
