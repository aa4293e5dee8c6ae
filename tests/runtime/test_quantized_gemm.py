"""Quantized GEMMs run as ONE generated kernel: dequantize prologues computed in the packers,
the quantize epilogue (round, clamp, cast) stored straight into an int8 C.

Each function is compiled through torch.compile with the vfuse backend and compared with eager.
int8 results may differ from eager by one where the fp32 sum (another summation order) or
our own erf in GELU lands a value on the other side of a rounding boundary; such elements must
stay rare. Shapes are small but cover both K <= KC (the epilogue sees the final sum) and
K > KC (partial sums in the fp32 workspace), the threads sharing one GEMM and each thread
running its own batch entries.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import vfuse
import vfuse.schedule.contraction as contraction
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel

Fn = Callable[..., torch.Tensor]


def _run(fn: Fn, *xs: torch.Tensor, kernels: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[ContractionKernel]]:
    """(vfuse's result, eager's, the contraction kernels); checks the kernel and group counts."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(*xs)
        ref = fn(*xs)
    (compiled,) = backend.compiled
    assert compiled.stats.torch_calls == 0 and not compiled.stats.fallbacks
    assert compiled.stats.kernels == kernels, compiled.executor.program
    if kernels == 1:
        assert len(compiled.plan.groups) == 1
    found = [k for k in compiled.executor.program.kernels if isinstance(k, ContractionKernel)]
    return got, ref, found


def _close_int(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal, or off by one at a few rounding boundaries."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    diff = (got.long() - ref.long()).abs()
    assert diff.max().item() <= 1
    assert diff.float().mean().item() < 0.01


def _quantize(y: torch.Tensor, scale: float = 0.05, zp: float = 1.0) -> torch.Tensor:
    return torch.clamp(torch.round(y / scale) + zp, -128, 127).to(torch.int8)


def _qlinear(xq: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = (xq.float() - 2.0) * 0.02  # per-tensor dequantize of the activations (A)
    w = wq.float() * ws[:, None]  # per-channel dequantize of Linear's N x K weight (B)
    return _quantize(F.gelu(x @ w.t() + b))


def _int8(*shape: int) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8)


@pytest.mark.parametrize("m, k, n", [(256, 512, 384), (37, 40, 50)])  # K > KC, K <= KC
def test_qlinear_per_channel_is_one_kernel(m: int, k: int, n: int) -> None:
    torch.manual_seed(0)
    args = (_int8(m, k), _int8(n, k), torch.rand(n) * 0.01, torch.randn(n))
    got, ref, (kern,) = _run(_qlinear, *args)
    _close_int(got, ref)
    assert kern.op is Op.MATMUL and all(p is not None for p in kern.prologues) and kern.epilogue
    report = vfuse.explain(_qlinear, *args)
    assert report.num_kernels == 1


def test_qlinear_per_tensor_weight_scale_and_zero_points() -> None:
    torch.manual_seed(1)

    def fn(xq: torch.Tensor, wq: torch.Tensor, wz: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = (xq.float() - 3.0) * 0.03
        w = (wq.float() - wz[:, None]) * 0.004  # per-channel zero point, per-tensor scale
        return _quantize(torch.relu(F.linear(x, w, b)), 0.02, -5.0)

    got, ref, _ = _run(fn, _int8(70, 300), _int8(90, 300), torch.randint(-4, 5, (90,)).float(), torch.randn(90))
    _close_int(got, ref)


def test_qlinear_on_3d_input() -> None:
    torch.manual_seed(8)
    args = (_int8(2, 9, 64), _int8(40, 64), torch.rand(40) * 0.01, torch.randn(40))
    got, ref, (kern,) = _run(_qlinear, *args)
    assert kern.prologue(0) is not None and kern.prologue(1) is not None
    _close_int(got, ref)


def test_int8_output_of_a_plain_fp32_linear() -> None:
    torch.manual_seed(2)
    fn = lambda x, w: _quantize(x @ w.t(), 0.1, 0.0)  # noqa: E731
    got, ref, (kern,) = _run(fn, torch.randn(64, 400), torch.randn(48, 400) * 0.05)
    assert kern.trans_b and not any(kern.prologues)  # operands read in place, only C is int8
    _close_int(got, ref)


@pytest.mark.parametrize("threads", [1, 2])
def test_bmm_with_cast_prologue_and_int8_output(threads: int) -> None:
    torch.manual_seed(3)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # 8 batch entries: each thread runs whole entries with its own workspace (K > KC). N = 64
        # fills whole register tiles: far narrower outputs are left to torch's library by the cost model.
        fn = lambda a, b: _quantize(torch.bmm(a.float() * 0.01, b), 0.02, 0.0)  # noqa: E731
        got, ref, _ = _run(fn, _int8(8, 30, 600), torch.randn(8, 600, 64) * 0.1)
    finally:
        torch.set_num_threads(old)
    _close_int(got, ref)


def test_matmul_broadcast_batch_with_cast_prologue_on_b() -> None:
    torch.manual_seed(4)
    fn = lambda x, wq: torch.tanh(x @ (wq.float() * 0.01))  # noqa: E731
    got, ref, (kern,) = _run(fn, torch.randn(3, 2, 9, 40), _int8(2, 40, 33))
    assert kern.prologue(0) is None and kern.prologue(1) is not None
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8, torch.bool])
def test_other_output_dtypes(dtype: torch.dtype) -> None:
    torch.manual_seed(6)
    fn = lambda x, w: (torch.relu(x @ w) * 4.0).to(dtype)  # noqa: E731
    got, ref, _ = _run(fn, torch.randn(20, 300), torch.randn(300, 36) * 0.1)
    if dtype.is_floating_point:
        torch.testing.assert_close(got, ref)
    elif dtype is torch.bool:  # relu's zeros are exact
        assert torch.equal(got, ref) and 0 < int(ref.sum()) < ref.numel()
    else:  # truncation toward zero: the fp32 sums may straddle an integer
        _close_int(got, ref)


def test_conv_with_cast_prologue_keeps_the_copy_path() -> None:
    torch.manual_seed(7)
    fn = lambda xq, w: F.conv2d(xq.float() * 0.1, w, padding=1)  # noqa: E731
    got, ref, (kern,) = _run(fn, _int8(1, 3, 10, 10), torch.randn(8, 3, 3, 3), kernels=2)
    assert kern.op is Op.CONV2D and not any(kern.prologues)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_operand_the_packer_cannot_compute_is_copied_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback when the lowering cannot express an operand: a copy kernel stores it first."""
    monkeypatch.setattr(contraction, "_lower_operand", lambda *a: None)
    torch.manual_seed(9)
    got, ref, (kern,) = _run(_qlinear, _int8(30, 70), _int8(20, 70), torch.rand(20) * 0.01, torch.randn(20), kernels=3)
    assert not any(kern.prologues) and kern.epilogue  # two copies, then the GEMM with its int8 epilogue
    _close_int(got, ref)
