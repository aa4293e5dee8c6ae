"""Training-mode dropout compiled by vfuse: reproducibility, statistics and exact values.

vfuse draws masks from its own counter-based generator, seeded per call from torch's (so
torch.manual_seed governs it): masks differ from eager's, so these tests check what must hold
for any correct dropout instead of comparing with eager element by element. Two graphs: bare
`dropout(x)` and `dropout(x * 2) + r`, where the mask is fused into a longer pointwise chain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import vfuse

P_VALUES = (0.1, 0.5)
N_STATS = 10**7  # standard error of the keep rate ~1.5e-4 at p=0.5: small biases show
N_THREADS_CHECK = 1 << 20  # enough elements that 2 OpenMP threads split the loop

Fn = Callable[[Tensor], Tensor]


def _compiled(p: float, chained: bool) -> Fn:
    """A compiled dropout over `x` (chained: dropout(x * 2) + r with a fixed r of zeros' shape)."""
    backend = vfuse.backend(strict=True)  # strict: an eager fallback would test torch, not vfuse
    if not chained:
        return torch.compile(lambda x: F.dropout(x, p, training=True), backend=backend, dynamic=False)
    chain = torch.compile(lambda x, r: F.dropout(x * 2, p, training=True) + r, backend=backend, dynamic=False)
    # r = 0.25 everywhere: dropped elements then come out exactly 0.25, kept ones 2x/(1-p) + 0.25.
    return lambda x: chain(x, torch.full_like(x, 0.25)) - 0.25


@pytest.fixture(scope="module", params=[(p, c) for p in P_VALUES for c in (False, True)], ids=str)
def case(request: pytest.FixtureRequest) -> Iterator[tuple[float, bool, Fn]]:
    p, chained = request.param
    fn = _compiled(p, chained)
    # Precondition on a small input before the 10^7-element tests: a kernel that reads or
    # writes the wrong buffer can crash the process on large ones instead of failing a test.
    x = _inputs(4096)
    out = fn(x)
    scaled = (2 * x if chained else x) * _scale(p)
    wrong = ~((out == 0) | torch.isclose(out, scaled, rtol=1e-6, atol=0))
    if wrong.any():
        pytest.fail(
            f"compiled dropout p={p} chained={chained}: {int(wrong.sum())} of 4096 outputs neither 0 nor x*scale"
        )
    yield p, chained, fn


def _inputs(n: int) -> Tensor:
    # Positive and away from 0, so "dropped" (== 0) and "kept" can never be confused.
    return torch.rand(n, generator=torch.Generator().manual_seed(1)) + 0.5


def _scale(p: float) -> Tensor:
    # Torch's convention (eager's kept values are exactly x * this f32 scale). An f32 division
    # x / (1 - p) can differ from it by one ulp when 1/(1-p) is not a power of two.
    return torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)


def _keep(out: Tensor) -> Tensor:
    return (out != 0).to(torch.float64)


def _corr(a: Tensor, b: Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).mean() / (a.std(correction=0) * b.std(correction=0)))


def test_same_seed_same_mask_on_one_and_two_threads(case: tuple[float, bool, Fn]) -> None:
    _, _, fn = case
    x = _inputs(N_THREADS_CHECK)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            torch.manual_seed(1234)
            outs.append(fn(x))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]), "the mask depends on the thread count"
    assert torch.equal(outs[0], outs[2]), "the same seed gave a different mask"


def test_keep_rate_within_three_standard_errors(case: tuple[float, bool, Fn]) -> None:
    p, _, fn = case
    torch.manual_seed(0)
    rate = float(_keep(fn(_inputs(N_STATS))).mean())
    stderr = math.sqrt(p * (1 - p) / N_STATS)
    assert abs(rate - (1 - p)) < 3 * stderr, f"keep rate {rate:.6f}, expected {1 - p} +- {3 * stderr:.2g}"


def test_kept_are_scaled_exactly_and_dropped_are_zero(case: tuple[float, bool, Fn]) -> None:
    p, chained, fn = case
    x = _inputs(1 << 16)
    torch.manual_seed(0)
    out = fn(x)
    kept = out != 0
    assert 0 < int(kept.sum()) < x.numel()
    if chained:
        # (2x * scale + 0.25) - 0.25 rounds twice, and the C++ compiler may contract the
        # multiply-add into an FMA: equal up to those roundings, not bit for bit.
        torch.testing.assert_close(out[kept], 2 * x[kept] * _scale(p), rtol=1e-6, atol=0)
    else:
        assert torch.equal(out[kept], x[kept] * _scale(p))
        if p == 0.5:  # 1/(1-p) = 2 is exact: here x * scale and x / (1 - p) are the same number
            assert torch.equal(out[kept], x[kept] / (1 - p))
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))


def test_consecutive_calls_draw_different_masks(case: tuple[float, bool, Fn]) -> None:
    _, _, fn = case
    x = _inputs(1 << 16)
    torch.manual_seed(0)
    first, second = _keep(fn(x)), _keep(fn(x))
    # Identical masks, or one the complement/shift of the other, would show as high agreement.
    assert not torch.equal(first, second)


def test_masks_are_uncorrelated_within_and_across_calls(case: tuple[float, bool, Fn]) -> None:
    _, _, fn = case
    x = _inputs(N_STATS)
    torch.manual_seed(0)
    first = _keep(fn(x))
    second = _keep(fn(x))
    # Under independence a sample correlation over n pairs has standard error ~1/sqrt(n).
    bound = 5 / math.sqrt(N_STATS)
    adjacent = _corr(first[:-1], first[1:])
    across = _corr(first, second)
    assert abs(adjacent) < bound, f"adjacent keep indicators correlate: {adjacent:.2e} (bound {bound:.1e})"
    assert abs(across) < bound, f"two calls' masks correlate: {across:.2e} (bound {bound:.1e})"
