"""Strided train-mode Conv-BatchNorm-ReLU steps (issue 14): the forward conv on the direct path over
phase planes (codegen/cpp/gemm/conv_direct.py), the weight gradient's folded GEMM with row runs
(codegen/cpp/gemm/conv_wgrad.py), against eager: outputs, running statistics and the gradients of
the input, the conv's weight and bias and BatchNorm's weight and bias, over two steps. Odd sizes:
prime planes, 1 / 3 / 5 channels, 1x1 stride 2 (ResNet's downsample), padding 0 and 1, groups."""

from __future__ import annotations

import pytest
import torch
from tests.training.conv_steps import ConvBnRelu, train_steps

from vfuse.schedule.kernel import ContractionKernel

# (N, C, H, W), Cout, kernel, stride, padding, groups
CASES = [
    ((2, 3, 13, 11), 5, 3, 2, 1, 1),
    ((3, 1, 7, 17), 3, 3, 2, 0, 1),
    ((2, 5, 11, 11), 1, 1, 2, 0, 1),  # 1x1 stride 2 (downsample), one output channel
    ((4, 8, 9, 9), 16, 1, 2, 0, 1),
    ((2, 6, 13, 7), 9, 3, 2, 1, 3),  # groups
    ((1, 3, 19, 23), 8, 7, 2, 3, 1),  # a stem's 7x7
]


@pytest.mark.parametrize(("shape", "cout", "k", "stride", "pad", "groups"), CASES)
def test_strided_conv_bn_relu_steps_match_eager(
    shape: tuple[int, ...], cout: int, k: int, stride: int, pad: int, groups: int
) -> None:
    torch.manual_seed(sum(shape) + cout)
    _, backend = train_steps(ConvBnRelu(shape[1], cout, k, stride, pad, groups).train(), shape)
    forward = backend.compiled[0].executor
    convs = [k for s in forward.program.segments for k in s.kernels if isinstance(k, ContractionKernel)]
    assert convs, "the forward conv is a generated kernel"
    assert "phase planes" in forward.source  # strided: the direct path over phase planes
