"""Reductions over several axes of a view, a permute or a reshape, against eager.

A row kernel reduces such a row through nested loops (one per reduced axis that the view
does not merge); the innermost loop was rendered as if it were the whole row, so every loop
but the last lost its partial sum ([2,16,14,14] viewed [2,4,4,196], summed over (2, 3): off
by 47; GroupNorm on 14x14 planes: off by 4). Each graph below holds many cases, one input
each (one g++ run per graph); a failure names the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import vfuse


@dataclass(frozen=True)
class Case:
    shape: tuple[int, ...]
    dims: tuple[int, ...]  # reduced axes of the viewed tensor
    view: tuple[int, ...] | None = None  # reshape(view) before reducing
    perm: tuple[int, ...] | None = None  # permute(perm) before the view

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.permute(self.perm)
        return x if self.view is None else x.reshape(self.view)


CASES = [
    Case((2, 16, 14, 14), (2, 3), view=(2, 4, 4, 196)),  # the example
    Case((1, 12, 12, 18), (1, 2, 3), view=(1, 4, 3, 216)),  # the example
    Case((2, 16, 12, 12), (2, 3), view=(2, 4, 4, 144)),  # GroupNorm's shape on 12x12
    Case((2, 16, 15, 16), (2, 3), view=(2, 4, 4, 240)),
    Case((5, 3, 131), (1, 2)),  # primes: 131 elements take the lanes path
    Case((3, 7, 13, 11), (1, 2), view=(3, 7, 143)),
    Case((1, 1, 131), (0, 1, 2)),  # ones: everything reduced
    Case((2, 1, 200), (1, 2)),
    Case((7, 3, 129), (0, 1)),  # reduced axes lead, kept one trails
    Case((5, 11, 17), (0, 2)),  # reduced axes around a kept one
    Case((3, 5, 1030), (1, 2)),  # long rows: strips and blocks of 1024
    Case((2, 3, 2048), (1, 2)),
    Case((2, 14, 14, 16), (2, 3), view=(2, 4, 4, 196), perm=(0, 3, 1, 2)),  # view after permute
    Case((4, 9, 130), (0, 2), perm=(2, 0, 1)),  # permute, then non-adjacent axes
    Case((6, 200, 3), (0, 2), perm=(0, 2, 1)),
    Case((3, 140, 5), (1, 2), perm=(0, 2, 1)),  # strided rows of the lanes path, nested
    Case((2, 12, 9, 20), (2, 3), view=(2, 5, 4, 108), perm=(0, 3, 1, 2)),
]
REDUCTIONS: dict[str, Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]] = {
    "sum": lambda t, d, k: t.sum(d, keepdim=k),
    "mean": lambda t, d, k: t.mean(d, keepdim=k),
    "var": lambda t, d, k: t.var(d, keepdim=k),
    "amax": lambda t, d, k: t.amax(d, keepdim=k),
    "logsumexp": lambda t, d, k: t.logsumexp(d, keepdim=k),
    # argmax takes one axis: the reduced axes flattened into the last one
    "argmax": lambda t, d, k: t.movedim(d, tuple(range(t.dim() - len(d), t.dim()))).flatten(-len(d)).argmax(-1, k),
}


def _graph(op: str, cases: list[Case]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """All cases in one function, keepdim alternating between them."""
    reduce = REDUCTIONS[op]

    def f(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(reduce(c.prepare(x), c.dims, i % 2 == 0) for i, (c, x) in enumerate(zip(cases, xs)))

    return f


def _inputs(cases: list[Case], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(c.shape, generator=g) for c in cases]


def _compare(op: str, cases: list[Case], got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for c, a, b in zip(cases, got, want, strict=True):
        assert a.shape == b.shape, f"{op} {c}"
        if op == "argmax":
            assert torch.equal(a, b), f"{op} {c}"
        else:
            torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=lambda m, c=c: f"{op} {c}: {m}")


@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_multiaxis_reductions_of_views_match_eager(op: str) -> None:
    f, xs = _graph(op, CASES), _inputs(CASES)
    compiled = vfuse.compile(f, xs)
    assert compiled.stats.backend == "cpp" and compiled.stats.torch_calls == 0
    _compare(op, CASES, compiled(*xs), f(*xs))


def test_multiaxis_reductions_through_dynamo() -> None:
    f, xs = _graph("sum", CASES), _inputs(CASES, seed=1)
    backend = vfuse.backend()
    got = torch.compile(f, backend=backend, dynamic=False)(*xs)
    _compare("sum", CASES, got, f(*xs))
    assert backend.stats["graphs"] == 1 and backend.stats["reference_graphs"] == 0


# (channels, groups, height, width): the wrong planes (14x14, 12x12, 14x16, 15x16), the
# right ones (7x7, 8x8, 10x10), primes, ones and a group per channel.
GROUP_NORMS = [
    (16, 4, 14, 14),
    (16, 4, 12, 12),
    (16, 4, 14, 16),
    (16, 4, 15, 16),
    (16, 4, 7, 7),
    (16, 4, 10, 10),
    (6, 3, 13, 11),
    (8, 1, 17, 19),
    (12, 12, 11, 13),
    (6, 2, 1, 1),
    (10, 5, 5, 23),
    (8, 2, 12, 13),
]
CHANNELS_LAST = 2  # the last ones get channels-last inputs: rows no loop merge can make contiguous


class GroupNorms(nn.Module):
    """One GroupNorm per shape, with non-trivial affine parameters."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.norms = nn.ModuleList(nn.GroupNorm(groups, c) for c, groups, _, _ in GROUP_NORMS)
        for n in self.norms:
            n.weight.data = torch.randn(n.weight.shape, generator=g)
            n.bias.data = torch.randn(n.bias.shape, generator=g)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        last = len(xs) - CHANNELS_LAST
        return tuple(n(x.permute(0, 3, 1, 2) if i >= last else x) for i, (n, x) in enumerate(zip(self.norms, xs)))


def _group_norm_inputs(grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, c, h, w, generator=g) for c, _, h, w in GROUP_NORMS]
    xs[-CHANNELS_LAST:] = [x.permute(0, 2, 3, 1).contiguous() for x in xs[-CHANNELS_LAST:]]
    return [x.requires_grad_(grad) for x in xs]


def test_group_norm_matches_eager() -> None:
    model, xs = GroupNorms().eval(), _group_norm_inputs()
    with torch.no_grad():
        got, want = vfuse.compile(model, xs)(*xs), model(*xs)
    for shape, a, b in zip(GROUP_NORMS, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, s=shape: f"GroupNorm {s}: {m}")


def test_group_norm_training_gradients_match_eager() -> None:
    model = GroupNorms().train()
    xs, ref = _group_norm_inputs(grad=True), _group_norm_inputs(grad=True)
    backend = vfuse.backend()
    outs = torch.compile(model, backend=backend, dynamic=False)(*xs)
    g = torch.Generator().manual_seed(4)
    seeds = [torch.randn(o.shape, generator=g) for o in outs]
    sum((o * s).sum() for o, s in zip(outs, seeds)).backward()
    got = [x.grad for x in xs] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sum((o * s).sum() for o, s in zip(model(*ref), seeds)).backward()
    want = [x.grad for x in ref] + [p.grad for p in model.parameters()]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, i=i: f"gradient {i}: {m}")
    assert backend.stats["reference_graphs"] == 0 and backend.stats["eager_graphs"] == 0
