"""Every seed pattern of the brief through backend="triton", target="h100": exactly one generated
kernel, no torch call, and eager's result in Triton's interpreter (the patterns are the C++
path's: tests/runtime/test_seed_kernels.py; the dropout ones checked element by element: each
output is dropped or eager's value over 1-p)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.kernel_families import FAMILIES
from tests.runtime.test_seed_kernels import PATTERNS
from torch import nn

import vfuse

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def _compile(fn: Callable, inputs: tuple, **options: Any) -> Any:
    compiled = vfuse.compile(fn, inputs, backend="triton", target="h100", strict=True, **options)
    stats = compiled.stats
    assert (stats.backend, stats.kernels, stats.torch_calls) == ("triton", 1, 0), stats
    return compiled


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_seed_pattern_is_one_triton_kernel(name: str) -> None:
    fn, make = PATTERNS[name]
    torch.manual_seed(0)
    inputs = make()
    if isinstance(fn, nn.Module):
        fn.eval()
    with torch.no_grad():
        expected = fn(*inputs)
        got = _compile(fn, inputs, freeze=isinstance(fn, nn.Module))(*inputs)
    if expected.dtype == torch.int8:
        assert (got.int() - expected.int()).abs().max() <= 1  # rounding of a 1e-7-different GELU
    else:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_int8_dequant_linear_quant_is_one_triton_kernel() -> None:
    """int8 dequantize -> linear + bias -> relu -> quantize: the GEMM template with the dequantize
    in its prologue and the quantize in its epilogue (power-of-two scales: exact, bit for bit)."""
    fn, inputs = FAMILIES["qlinear"]
    got = _compile(fn, inputs)(*inputs)
    assert got.dtype == torch.int8 and torch.equal(got, fn(*inputs))


def _kept_or_dropped(got: torch.Tensor, kept: torch.Tensor, dropped: torch.Tensor, p: float) -> None:
    ok_kept = torch.isclose(got, kept, rtol=1e-5, atol=1e-5)
    ok_dropped = torch.isclose(got, dropped, rtol=0, atol=1e-6)
    assert bool((ok_kept | ok_dropped).all())
    rate = ok_kept.float().mean().item()
    assert abs(rate - (1 - p)) < 5 * ((1 - p) * p / got.numel()) ** 0.5 + 1e-3


def test_linear_gelu_dropout_is_one_triton_kernel() -> None:
    x, w, b = torch.randn(40, 48), torch.randn(80, 48) * 0.2, torch.randn(80)
    fn = lambda x, w, b: F.dropout(F.gelu(F.linear(x, w, b)), 0.2, training=True)  # noqa: E731
    got = _compile(fn, (x, w, b))(x, w, b)
    y = F.gelu(F.linear(x, w, b))
    _kept_or_dropped(got, y / 0.8, torch.zeros_like(y), 0.2)


def test_gelu_dropout_residual_is_one_triton_kernel() -> None:
    x, r = torch.randn(64, 96), torch.randn(64, 96)
    fn = lambda x, r: F.dropout(F.gelu(x), 0.25, training=True) + r  # noqa: E731
    got = _compile(fn, (x, r))(x, r)
    _kept_or_dropped(got, F.gelu(x) / 0.75 + r, r, 0.25)
