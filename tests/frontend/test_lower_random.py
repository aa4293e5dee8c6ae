"""Random lowerings: dropout, bernoulli, rand/rand_like and uniform become RAND nodes reading
one shared RNG_SEED. Numbers differ from eager's generator, so these tests check structure,
the exact dropout arithmetic, the distributions, and determinism under torch.manual_seed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import check, fallbacks, lower_fn, ops_of

from vfuse.interp import run
from vfuse.ir import Graph, Op

aten = torch.ops.aten
N = 20_000  # enough draws that a kept fraction is within 0.02 of p with overwhelming probability


def _run_seeded(graph: Graph, inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return run(graph, inputs)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_native_dropout_arithmetic_mask_and_rate(p: float) -> None:
    x = torch.randn(N // 100, 100) + 3  # nonzero, so dropped elements are exactly the zeros
    graph = lower_fn(lambda x: aten.native_dropout(x, p, True), [x])
    ops = ops_of(graph)
    assert not fallbacks(graph)
    assert ops[Op.RNG_SEED] == 1 and ops[Op.RAND] == 1 and ops[Op.GE] == 1
    y, mask = _run_seeded(graph, [x], 0)
    assert mask.dtype == torch.bool and y.shape == x.shape
    torch.testing.assert_close(y, torch.where(mask, x / (1 - p), torch.zeros(())), rtol=1e-6, atol=0)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.02


def test_dropout_is_deterministic_under_manual_seed() -> None:
    x = torch.randn(64, 64)
    graph = lower_fn(lambda x: F.dropout(x, 0.3, training=True), [x])
    (a,), (b,), (c,) = (_run_seeded(graph, [x], s) for s in (7, 7, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_two_dropouts_share_one_seed_with_distinct_streams() -> None:
    x = torch.randn(64, 64)
    graph = lower_fn(lambda x: (F.dropout(x, 0.5, True), F.dropout(x, 0.5, True)), [x])
    rands = [n for n in graph.nodes if n.op is Op.RAND]
    assert ops_of(graph)[Op.RNG_SEED] == 1 and len({n.attrs["stream"] for n in rands}) == 2
    a, b = _run_seeded(graph, [x], 0)
    assert not torch.equal(a != 0, b != 0)


def test_dropout_eval_and_p0_and_p1() -> None:
    x = torch.randn(8, 8)
    graph = check(lambda x: (F.dropout(x, 0.5, training=False), F.dropout(x, 0.0, training=True)), x)
    assert ops_of(graph)[Op.RAND] == 0
    graph = lower_fn(lambda x: aten.native_dropout(x, 1.0, True), [x])
    y, mask = run(graph, [x])
    assert torch.equal(y, torch.zeros_like(x)) and not mask.any()


def test_bernoulli_rand_and_uniform_distributions() -> None:
    x = torch.full((N,), 0.25)

    def fn(x: torch.Tensor) -> tuple:
        return (torch.bernoulli(x), torch.bernoulli(x, 0.75), torch.rand_like(x), torch.rand(N, dtype=torch.float64),
                torch.empty(N).uniform_(-2.0, 4.0), torch.rand_like(x.half()))  # fmt: skip

    graph = lower_fn(fn, [x])
    assert not fallbacks(graph) and ops_of(graph)[Op.RAND] == 6 and ops_of(graph)[Op.RNG_SEED] == 1
    b1, b2, r, r64, u, rh = _run_seeded(graph, [x], 3)
    assert b1.dtype == torch.float32 and set(b1.unique().tolist()) <= {0.0, 1.0}
    assert abs(b1.mean().item() - 0.25) < 0.02 and abs(b2.mean().item() - 0.75) < 0.02
    for v, lo, hi in ((r, 0, 1), (r64, 0, 1), (u, -2, 4), (rh.float(), 0, 1)):
        assert lo <= v.min().item() and v.max().item() <= hi
        assert abs(v.mean().item() - (lo + hi) / 2) < 0.03 * (hi - lo)
    assert r64.dtype == torch.float64 and rh.dtype == torch.float16
