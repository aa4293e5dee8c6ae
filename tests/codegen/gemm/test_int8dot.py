"""Quantized linear layers as exact int32 dot products (schedule/int8dot.py, codegen/cpp/gemm/int8.py).

The compiled result must equal the exact value (float64 of the integer sum times the scales)
to fp32 rounding, and eager (which dequantizes to fp32 and sums in fp32) to eager's own
rounding: odd M / K / N (tails of the 12 x 32 tile and of the 4-byte k groups), zero points on
both operands, per-tensor and per-channel weight scales, a fused epilogue. The schedule picks
the int8 kernel only where the target has VNNI and the operands are int8 dequantizations.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.schedule.kernel import ContractionKernel, DotKind
from vfuse.targets import get_target
from vfuse.targets.isa import IsaExtra

VNNI = IsaExtra.VNNI in get_target("cpu").isa_extras
needs_vnni = pytest.mark.skipif(not VNNI, reason="this CPU (or the forced tier) has no AVX-512 VNNI")
_G = torch.Generator().manual_seed(8)


def _int8(*shape: int) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=_G, dtype=torch.int8)


def _qlinear(za: float, zw: float, sa: float, per_channel: bool) -> Callable:
    def fn(xq: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        x = (xq.float() - za) * sa
        w = (wq.float() - zw) * (ws[:, None] if per_channel else 0.01)
        return F.linear(x, w)

    return fn


def _contraction(compiled: object) -> ContractionKernel:
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    (k,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    return k


@needs_vnni
@pytest.mark.parametrize(
    ("m", "k", "n", "za", "zw", "per_channel"),
    [
        (1, 1, 1, 0.0, 0.0, True),
        (7, 13, 33, 3.0, 0.0, True),
        (37, 131, 29, -128.0, 5.0, False),
        (25, 64, 70, 127.0, -7.0, True),
        (64, 1027, 96, 2.0, 0.0, True),
    ],
)
def test_int8_dot_matches_exact_and_eager(m: int, k: int, n: int, za: float, zw: float, per_channel: bool) -> None:
    xq, wq, ws = _int8(m, k), _int8(n, k), torch.rand(n, generator=_G) * 0.02 + 0.001
    fn = _qlinear(za, zw, 0.037, per_channel)
    compiled = vfuse.compile(fn, (xq, wq, ws), backend="cpp")
    q = _contraction(compiled).int8
    assert q is not None and q.kind is DotKind.VNNI and (q.x_zero, q.w_zero) == (int(za), int(zw))
    got = compiled(xq, wq, ws)
    dot = (xq.double() - za) @ (wq.double() - zw).T  # exact: integers below 2^53
    exact = dot * 0.037 * (ws.double() if per_channel else torch.tensor(0.01, dtype=torch.float32).double())
    torch.testing.assert_close(got, exact.float(), rtol=2e-7, atol=1e-30)  # one rounding of the exact value
    scale = float((xq.double() - za).abs().max() * (wq.double() - zw).abs().max() * 0.037 * ws.max())
    # Eager's fp32 sums err by up to ~K ulps of the summands' size; the exact value is closer.
    torch.testing.assert_close(got, fn(xq, wq, ws), rtol=1e-5, atol=k * scale * 2e-7)


@needs_vnni
def test_epilogue_bias_gelu_quantize() -> None:
    """The qlinear workload's shape: dequantize, linear + bias, GELU, quantize to int8 in one kernel.
    Power-of-two scales: eager's fp32 sums are exact too, so the int8 results are equal."""

    def fn(xq: torch.Tensor, wq: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = F.gelu(F.linear((xq.float() - 2.0) * 0.0625, wq.float() * 2.0**-9, bias))
        return torch.clamp(torch.round(y / 0.0625) + 1.0, -128, 127).to(torch.int8)

    xq, wq, bias = _int8(45, 200), _int8(67, 200), torch.randint(-64, 64, (67,), generator=_G) / 64
    compiled = vfuse.compile(fn, (xq, wq, bias), backend="cpp")
    assert _contraction(compiled).int8 is not None
    assert torch.equal(compiled(xq, wq, bias), fn(xq, wq, bias))


@pytest.mark.parametrize("case", ["fp32 operands", "fractional zero point", "avx2 tier"])
def test_other_matmuls_keep_the_fp32_template(case: str) -> None:
    xq, wq, ws = _int8(9, 40), _int8(11, 40), torch.rand(11, generator=_G)
    fn, inputs, isa = _qlinear(2.0, 0.0, 0.5, True), (xq, wq, ws), "auto"
    if case == "fp32 operands":
        fn, inputs = (lambda x, w: F.linear(x, w)), (torch.randn(9, 40), torch.randn(11, 40))
    elif case == "fractional zero point":
        fn = _qlinear(2.5, 0.0, 0.5, True)
    elif "avx2" not in {t.value for t in _tiers()}:
        pytest.skip("this CPU has no AVX2 tier")
    else:
        isa = "avx2"
    compiled = vfuse.compile(fn, inputs, backend="cpp", isa=isa)
    assert _contraction(compiled).int8 is None
    want = fn(*inputs)
    torch.testing.assert_close(compiled(*inputs), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def _tiers() -> list:
    from tests.kernel_families import tiers_here

    return tiers_here()
