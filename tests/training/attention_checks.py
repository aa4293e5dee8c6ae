"""Checks shared by the training-attention tests (the flash backward and the written-out rewrite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def check_attention_grads(fn: Callable, inputs: list[torch.Tensor], backend: Any, compiled: Any = None) -> None:
    """Output and grads of q, k, v against eager within 1e-4 relative (to each tensor's largest element)."""
    out = (compiled or torch.compile(fn, backend=backend))(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, inputs, grad_out)
    want_out = fn(*inputs)
    want = torch.autograd.grad(want_out, inputs, grad_out)
    # NaN where eager has NaN (a fully masked row), the scales of the finite elements
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4 * _largest(want_out), equal_nan=True)
    # A gradient that is 0 in exact arithmetic (one key: dS = P (dP - delta) cancels) is rounding of the
    # others' size: each tensor's scale is at least 1% of the largest gradient of the three.
    largest = max(_largest(w) for w in want)
    for name, g, w in zip("qkv", got, want, strict=True):
        scale = max(_largest(w), 1e-2 * largest)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * scale, equal_nan=True, msg=f"gradient of {name}")


def _largest(t: torch.Tensor) -> float:
    """The largest finite |element| (0 if none)."""
    finite = t[t.isfinite()]
    return finite.abs().max().item() if finite.numel() else 0.0
