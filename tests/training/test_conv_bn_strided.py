"""Strided train-mode Conv-BatchNorm-ReLU steps (issue 14): the forward conv on the direct path over
phase planes (codegen/cpp/gemm/conv_direct.py), the weight gradient's folded GEMM with row runs
(codegen/cpp/gemm/conv_wgrad.py), against eager: outputs, running statistics and the gradients of
the input, the conv's weight and bias and BatchNorm's weight and bias, over two steps. Odd sizes:
prime planes, 1 / 3 / 5 channels, 1x1 stride 2 (ResNet's downsample), padding 0 and 1, groups."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.schedule.kernel import ContractionKernel


class ConvBnRelu(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, pad: int, groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=pad, groups=groups)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


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
    torch._dynamo.reset()
    torch.manual_seed(sum(shape) + cout)
    eager = ConvBnRelu(shape[1], cout, k, stride, pad, groups).train()
    with torch.no_grad():
        eager.bn.weight.uniform_(0.5, 1.5)
        eager.bn.bias.uniform_(-0.5, 0.5)
    model = copy.deepcopy(eager)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(*shape)
        xe, xv = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = eager(xe), compiled(xv)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        grad_out = torch.randn_like(want)
        want.backward(grad_out)
        got.backward(grad_out)
        grads = [(xv.grad, xe.grad)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]
        # relative to the gradients' scale: the conv bias before BatchNorm has a zero gradient in
        # exact arithmetic (rounding noise of the others' scale)
        scale = max(w.abs().max().item() for _, w in grads)
        for g, w in grads:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * scale)
        for name in ("running_mean", "running_var"):
            torch.testing.assert_close(getattr(model.bn, name), getattr(eager.bn, name))
    forward = backend.compiled[0].executor
    convs = [k for s in forward.program.segments for k in s.kernels if isinstance(k, ContractionKernel)]
    assert convs, "the forward conv is a generated kernel"
    assert "phase planes" in forward.source  # strided: the direct path over phase planes
