"""The conv template's layout (schedule/gpu.py `conv_layout`, codegen/triton/conv.py) in Triton's
interpreter against eager: NHWC implicit GEMM where x and w are graph inputs or constants read
only by convs (bound channels-last: K steps within one tap when the channels allow, lanes
decoding their tap otherwise), NCHW where another kernel reads them row-major; the general and
the lean call paths; a frozen Conv-BN's folded weight (a constant) read channels-last.
Shapes stay tiny (one or two programs each)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton
from torch import nn

import vfuse
from vfuse.runtime.triton import TritonExecutor
from vfuse.schedule.gpu_types import ConvLayout
from vfuse.schedule.kernel import ContractionKernel

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

CL = torch.channels_last
BF16 = torch.bfloat16


def _bn_relu(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(F.conv2d(x, w, stride=(2, 1), padding=1), m, v, training=False).relu()


# name: (fn, inputs, tolerance, layout, tap steps)
CASES: dict[str, tuple[Callable, tuple[torch.Tensor, ...], float, ConvLayout, bool]] = {
    # 16 channels: K steps of 16 within a tap; stride (2, 1), padding, 17 outputs, batch 1
    "taps_bn_relu": (
        _bn_relu,
        (
            torch.randn(1, 16, 7, 6).contiguous(memory_format=CL),
            torch.randn(17, 16, 3, 3),
            torch.randn(17),
            torch.rand(17) + 0.5,
        ),
        2e-5,
        ConvLayout.NHWC,
        True,
    ),
    "taps_1x1_groups_stride2": (
        lambda x, w: F.conv2d(x, w, stride=2, groups=2) * 0.5,
        (torch.randn(2, 32, 5, 3), torch.randn(6, 16, 1, 1)),
        2e-5,
        ConvLayout.NHWC,
        True,
    ),
    "taps_bf16_dilated": (
        lambda x, w: F.conv2d(x, w, padding=2, dilation=2),
        (torch.randn(1, 32, 6, 5).to(BF16).contiguous(memory_format=CL), torch.randn(8, 32, 3, 3).to(BF16)),
        3e-2,
        ConvLayout.NHWC,
        True,
    ),
    # 5 channels: K lanes decode (kh, kw, cin); a K tail
    "lanes_odd_channels": (
        lambda x, w: F.conv2d(x, w, stride=2, padding=(0, 1)).relu(),
        (torch.randn(2, 5, 7, 7), torch.randn(3, 5, 3, 2)),
        2e-5,
        ConvLayout.NHWC,
        False,
    ),
    # x also read by the epilogue (a residual): one binding per value, so NCHW
    "nchw_residual": (
        lambda x, w: F.conv2d(x, w, padding=1) + x,
        (torch.randn(1, 16, 5, 5), torch.randn(16, 16, 3, 3)),
        2e-5,
        ConvLayout.NCHW,
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_layout_and_numerics(case: str) -> None:
    fn, inputs, tol, layout, taps = CASES[case]
    compiled = compile_triton(fn, inputs)
    got, want = compiled(*inputs), fn(*inputs)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0, compiled.stats
    ex = compiled.compiled.executor
    (k,) = [k for k in ex.program.kernels if isinstance(k, ContractionKernel)]
    assert k.gpu is not None and (k.gpu.layout, k.gpu.tap_steps) == (layout, taps)
    expected = set(k.operands[:2]) if layout is ConvLayout.NHWC else set()
    assert ex.rendered.channels_last == expected
    if taps:  # a step's channels are one contiguous run: 16-byte loads on a GPU
        assert f"row_[:, None] + tl.arange(0, {k.gpu.block_k})[None, :]" in ex.source
        assert k.shapes[1][1] % k.gpu.block_k == 0


def test_a_weight_shared_with_a_conv_that_cannot_read_nhwc_keeps_both_nchw() -> None:
    """w is read by a conv of x and one of relu(x) (computed: not bound channels-last), so neither
    conv reads w as OHWI."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w) + F.conv2d(x.relu() * 2, w)

    inputs = (torch.randn(1, 16, 4, 5), torch.randn(16, 16, 1, 1))
    compiled = compile_triton(fn, inputs)
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=2e-5, atol=2e-5)
    ex = compiled.compiled.executor
    convs = [k for k in ex.program.kernels if isinstance(k, ContractionKernel)]
    assert convs and all(k.gpu is not None and k.gpu.layout is ConvLayout.NCHW for k in convs)
    assert not ex.rendered.channels_last


def test_lean_call_binds_channels_last_inputs() -> None:
    """The lean path (runtime/triton_lean.py, forced onto the CPU) converts an NCHW caller's x and
    w to channels-last, and takes channels-last ones as they are: both match eager."""
    fn, inputs, tol, _, _ = CASES["taps_bn_relu"]
    compiled = compile_triton(fn, inputs)
    ex = compiled.compiled.executor
    assert isinstance(ex, TritonExecutor) and not ex._memory
    ex.lean_devices = ("cpu",)
    for xs in (inputs, tuple(t.contiguous() for t in inputs)):
        torch.testing.assert_close(compiled(*xs), fn(*xs), rtol=tol, atol=tol)
    assert ex._mem is not None and ex._mem.lean is not None


def test_frozen_conv_bn_reads_the_folded_weight_channels_last() -> None:
    """freeze=True folds BatchNorm into the conv's weight and bias (constants): the template reads
    the folded weight as OHWI and adds the folded bias in its epilogue."""
    model = nn.Sequential(nn.Conv2d(16, 19, 3, padding=1, bias=False), nn.BatchNorm2d(19), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 16, 5, 7).contiguous(memory_format=CL)
    compiled = vfuse.compile(model, (x,), backend="triton", target="h100", freeze=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=2e-5, atol=2e-5)
    ex = compiled.compiled.executor
    (k,) = [k for k in ex.program.kernels if isinstance(k, ContractionKernel)]
    assert k.gpu is not None and k.gpu.layout is ConvLayout.NHWC and k.gpu.tap_steps
    assert compiled.stats.kernels == 1 and k.operands[1] in ex.rendered.channels_last
