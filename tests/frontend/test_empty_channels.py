"""A conv over 0 input channels: torch gives (N, 0, H', W') (eager, meta and fake alike), so the IR
does too (`ir/shapes.conv2d`). Before, vfuse lowered it to (N, Cout, H', W'), ran the empty conv
through torch, which returned (N, 0, ...), and its bias kernel read 4 floats from a null pointer:
a segfault (found by make fuzz on a Xeon, session 24: conv -> BatchNorm -> ReLU of an empty input).
And any lowering whose shape disagrees with torch's now runs that node through torch
(`frontend/lower._checked`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
import vfuse.ir.shapes as shapes


def _conv_bn_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(F.batch_norm(F.conv2d(x, w, b), None, None, training=True))


@pytest.mark.parametrize(
    ("x", "w", "groups"),
    [((1, 0, 2, 2), (1, 0, 1, 1), 1), ((2, 0, 5, 5), (3, 0, 3, 3), 1), ((2, 0, 5, 5), (4, 0, 1, 1), 2)],
)
def test_a_conv_of_no_input_channels_matches_eager(x: tuple, w: tuple, groups: int) -> None:
    xs = (torch.randn(x), torch.randn(w), torch.randn(w[0]))

    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, groups=groups) * 2

    for fn in (conv, _conv_bn_relu) if groups == 1 else (conv,):
        want = fn(*xs)
        got = vfuse.compile(fn, xs)(*xs)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, equal_nan=True)


def test_a_lowering_that_disagrees_with_torchs_shape_runs_through_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old conv shape rule, put back: the node runs through torch, the result is eager's."""

    def old(x: tuple, w: tuple, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> tuple:
        h = shapes.conv_out(x[2], w[2], stride[0], padding[0], dilation[0])
        return (x[0], w[0], h, shapes.conv_out(x[3], w[3], stride[1], padding[1], dilation[1]))

    monkeypatch.setattr(shapes, "conv2d", old)
    xs = (torch.randn(1, 0, 2, 2), torch.randn(1, 0, 1, 1), torch.randn(1))
    compiled = vfuse.compile(_conv_bn_relu, xs)
    got = compiled(*xs)
    assert got.shape == (1, 0, 2, 2)
    torch.testing.assert_close(got, _conv_bn_relu(*xs))
