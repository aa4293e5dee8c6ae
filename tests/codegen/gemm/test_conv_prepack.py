"""Frozen conv weights packed once (`ContractionKernel.prepacked_b` on CONV2D, gemm/conv_prepack.py).

Both conv paths (the direct stride-1 kernel and the implicit GEMM, pointwise 1x1 and column phases
included) read a constant weight packed into the arena on the first call; later calls with other
inputs must match eager. Odd geometries: prime channels, batch 1, stride 2, padding, groups, 1x1,
3x3 and a 7x7 stem; every tier this CPU runs on two of them.
"""

from __future__ import annotations

import pytest
import torch
from tests.kernel_families import tiers_here
from torch import nn

import vfuse
from vfuse.schedule.kernel import ContractionKernel

TIERS = [t.value for t in tiers_here()]
# (batch, c_in, h, w, c_out, kernel, stride, padding, groups)
CASES = {
    "3x3_prime_batch1": (1, 7, 11, 13, 13, 3, 1, 1, 1),  # direct path
    "3x3_no_pad": (2, 4, 8, 9, 6, 3, 1, 0, 1),
    "3x3_groups": (2, 6, 8, 8, 9, 3, 1, 1, 3),
    "3x3_stride2": (2, 5, 9, 10, 11, 3, 2, 1, 1),  # implicit GEMM over column phases
    "1x1_batch1": (1, 13, 6, 7, 17, 1, 1, 0, 1),  # pointwise: X read as the B matrix
    "1x1_stride2": (3, 6, 9, 9, 19, 1, 2, 0, 1),
    "7x7_stem": (1, 3, 23, 19, 10, 7, 2, 3, 1),
}


def _model(case: str) -> tuple[nn.Module, tuple[int, ...]]:
    n, c, h, w, o, k, s, p, g = CASES[case]
    torch.manual_seed(sum(CASES[case]))
    bn = nn.BatchNorm2d(o)
    with torch.no_grad():  # non-trivial statistics: the folded weight differs from the conv's
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 2)
    return nn.Sequential(nn.Conv2d(c, o, k, s, p, groups=g, bias=False), bn, nn.ReLU()).eval(), (n, c, h, w)


def _conv_kernel(compiled: object) -> ContractionKernel:
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    (k,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    return k


def _check(model: nn.Module, shape: tuple[int, ...], isa: str) -> None:
    with torch.no_grad():
        compiled = vfuse.compile(model, (torch.randn(shape),), backend="cpp", freeze=True, isa=isa)
        assert _conv_kernel(compiled).prepacked_b
        for call in range(3):  # the first call packs, the others read the packed weight
            x = torch.randn(shape) * (call + 1)
            want = model(x)
            torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("case", list(CASES))
def test_frozen_conv_weight_packed_once_matches_eager(case: str) -> None:
    _check(*_model(case), TIERS[-1])


@pytest.mark.parametrize("isa", TIERS[:-1])
@pytest.mark.parametrize("case", ["3x3_prime_batch1", "3x3_stride2"])
def test_frozen_conv_other_tiers(case: str, isa: str) -> None:
    _check(*_model(case), isa)


def test_same_architecture_other_weights_keep_their_own_packing() -> None:
    """One cached library, two models: each packs its own weight into its own arena."""
    (m1, shape), (m2, _) = _model("3x3_prime_batch1"), _model("3x3_prime_batch1")
    with torch.no_grad():
        m2[0].weight.mul_(-1.5)
        c1 = vfuse.compile(m1, (torch.randn(shape),), backend="cpp", freeze=True)
        c2 = vfuse.compile(m2, (torch.randn(shape),), backend="cpp", freeze=True)
        x = torch.randn(shape)
        for _ in range(2):
            torch.testing.assert_close(c1(x), m1(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(c2(x), m2(x), rtol=1e-4, atol=1e-4)


def test_live_weights_are_not_packed_once() -> None:
    model, shape = _model("3x3_stride2")
    with torch.no_grad():
        compiled = vfuse.compile(model, (torch.randn(shape),), backend="cpp", freeze=False)
    assert not _conv_kernel(compiled).prepacked_b
