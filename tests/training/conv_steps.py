"""Two train-mode Conv-BatchNorm-ReLU steps through vfuse against eager, shared by the conv training tests."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import vfuse


class ConvBnRelu(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, pad: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=pad, groups=groups)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def init_bn(eager: ConvBnRelu) -> None:
    """BatchNorm's affine parameters away from 1 and 0, so that their gradients and uses show."""
    with torch.no_grad():
        eager.bn.weight.uniform_(0.5, 1.5)
        eager.bn.bias.uniform_(-0.5, 0.5)


def check_step(eager: ConvBnRelu, model: ConvBnRelu, compiled: Callable, x: torch.Tensor) -> None:
    """One forward and backward of `eager` and of `compiled` (which runs `model`) on `x`: the
    output, the input's and every parameter's gradient and the running statistics against eager's."""
    xe, xv = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(xe), compiled(xv)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    grad_out = torch.randn_like(want)
    want.backward(grad_out)
    got.backward(grad_out)
    grads = [(xv.grad, xe.grad)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]
    # relative to the gradients' scale: the conv bias before BatchNorm has a gradient that is
    # zero in exact arithmetic (rounding noise of the others' scale)
    scale = max(w.abs().max().item() for _, w in grads)
    for g, w in grads:
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * scale)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(eager.bn, name))


def train_steps(eager: ConvBnRelu, shape: tuple[int, ...]) -> tuple[ConvBnRelu, vfuse.VfuseBackend]:
    """Two steps of `eager` and its compiled copy on the same inputs (`check_step`); the compiled
    copy and its backend."""
    torch._dynamo.reset()
    init_bn(eager)
    model = copy.deepcopy(eager)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):  # the second step runs on running statistics the first updated
        check_step(eager, model, compiled, torch.randn(*shape))
    return model, backend
