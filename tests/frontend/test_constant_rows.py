"""Normalizations and variances of constant rows are exact, as eager's Welford moments make them.

The frontend takes a mean as x0 + sum(x - x0) / n with x0 the row's first element
(lower_reduce._shifted_mean): over a constant row every x - x0 is 0, so the mean is the value, the
variance 0 and a normalized row exactly 0 (a plain sum / n is an ulp off, and LayerNorm then gave
ulp * rstd: 3e-5 at eps 1e-3, where eager gives 0; found by `make fuzz`). Checked through
torch.compile (the generated C++) and the reference executor, bit for bit against eager.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import lower_fn

import vfuse  # noqa: F401  (registers the backend)
from vfuse.interp import run


def _affine(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linspace(-2, 2, n), torch.ones(n)


FNS: dict[str, Callable[[torch.Tensor], object]] = {
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:], eps=1e-3),
    "layer_norm_2d": lambda x: F.layer_norm(x, x.shape[-2:]),
    "layer_norm_affine": lambda x: F.layer_norm(x, x.shape[-1:], *_affine(x.shape[-1])),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=0),
    "std": lambda x: torch.std(x, -1, keepdim=True),
    "group_norm": lambda x: F.group_norm(x.reshape(x.shape[0], -1, 1), 1),
}
SHAPES = [(37, 11), (5, 1), (2, 3, 7), (4, 33), (3, 300)]


@pytest.mark.parametrize("name", FNS)
@pytest.mark.parametrize("value", [0.1, -3.7, 1e4, 1 / 3])
def test_constant_rows_match_eager_exactly(name: str, value: float) -> None:
    fn = FNS[name]
    for shape in SHAPES:
        if shape[-1] == 1 and name == "std":
            continue  # one element, correction 1: NaN (and a warning) in eager and here
        x = torch.full(shape, value)
        want = fn(x)
        want = want if isinstance(want, tuple) else (want,)
        got = torch.compile(fn, backend="vfuse", dynamic=False)(x)
        got = got if isinstance(got, tuple) else (got,)
        interp = run(lower_fn(fn, [x]), [x])
        for g, i, w in zip(got, interp, want, strict=True):
            assert torch.equal(g, w), f"{name} {shape}: {g.flatten()[:3]} vs eager {w.flatten()[:3]}"
            assert torch.equal(i, w), f"{name} {shape} (reference executor): {i.flatten()[:3]}"
    torch._dynamo.reset()


@pytest.mark.parametrize("value", [0.1, 1e4])
def test_batch_norm_and_whole_tensor_variance_of_constants_are_exact(value: float) -> None:
    """Where eager sums (an ulp off: batch norm of a constant 1e4 comes out 0.027, torch.var of
    a constant 0.1 is 6e-17), vfuse gives exactly 0."""
    x = torch.full((4, 3, 5, 5), value)
    got = torch.compile(lambda t: (F.batch_norm(t, None, None, training=True), torch.var(t)), backend="vfuse")(x)
    assert torch.equal(got[0], torch.zeros_like(x)) and got[1].item() == 0.0
