"""The seeds of training dropout (entry/dropout.py: `randint(0, SEED_HIGH, ())`, one for vfuse's
attention_dropout, one for the decomposed native_dropout) are vfuse's RNG_SEED nodes
(frontend/lower_random.lower_seed_draw), not torch fallbacks: the same draw from torch's generator,
saved by the forward for the backward, which regenerates the masks from it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tests.models.zoo import GPT2Block
from tests.training.attention_checks import check_attention_grads
from tests.training.test_attention_dropout import _inputs

import vfuse
from vfuse.entry.dropout import attention_dropout
from vfuse.frontend import registry
from vfuse.ir import Op

aten = torch.ops.aten


def _step(model: torch.nn.Module, backend, x: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """One training step of `model` compiled with `backend` under torch.manual_seed(seed): the output
    and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return [out.detach(), *(p.grad for p in model.parameters())]


def _ops(backend, op: Op) -> list[int]:
    """Per compiled graph, how many of its IR nodes are `op`."""
    return [sum(n.op is op for n in c.plan.graph.nodes) for c in backend.compiled]


def test_gpt2_block_step_draws_its_seeds_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2's block with attention and residual dropout: no fallback; the forward draws two RNG_SEEDs
    (attention_dropout's and the decomposed dropouts'), the backward none (it reads the saved seeds).
    Output and gradients equal the same step with the draws run through torch (the lowering taken
    out of the table) under the same torch seed; the same seed repeats the step, another changes it."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = GPT2Block(d=32, heads=4, dropout=0.2), torch.randn(2, 23, 32)
    ours = vfuse.backend(strict=True)
    compiled = torch.compile(copy.deepcopy(model), backend=ours)
    got = _step(compiled, ours, x, 5)
    assert not ours.stats["fallbacks"], ours.stats
    assert _ops(ours, Op.RNG_SEED) == [2, 0] and _ops(ours, Op.OPAQUE) == [0, 0]
    assert [d.rewritten and d.dropout for d in ours.attention] == [0.2]
    again, other = _step(compiled, ours, x, 5), _step(compiled, ours, x, 6)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(got[0], other[0])

    torch._dynamo.reset()
    monkeypatch.delitem(registry.TABLE, aten.randint.low)
    theirs = vfuse.backend(strict=True)
    want = _step(torch.compile(copy.deepcopy(model), backend=theirs), theirs, x, 5)
    assert theirs.stats["fallbacks"]["aten.randint.low"] == 2, theirs.stats
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _after_torch_draw(mode: str):
    """SDPA with dropout after a random op vfuse runs through torch (randn) or draws itself (rand)."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sdpa=F.scaled_dot_product_attention) -> torch.Tensor:
        noise = torch.randn_like(q) if mode == "randn" else torch.rand_like(q)
        return sdpa(q + 0.01 * noise, k, v, dropout_p=0.3, is_causal=True)

    return fn


def test_seed_after_a_torch_random_op_keeps_torchs_order() -> None:
    """Seeds are drawn when a call starts; torch's random ops when their step runs. A seed drawn after
    an opaque randn stays in torch (visible) so it is the value eager draws: the compiled output and
    gradients equal attention_dropout's eagerly after the same randn under the same torch seed."""
    torch._dynamo.reset()
    inputs = _inputs((1, 2, 1, 19, 11, 8, 8))
    backend = vfuse.backend(strict=True)
    fn = _after_torch_draw("randn")
    compiled = torch.compile(fn, backend=backend)
    compiled(*inputs)
    torch.manual_seed(3)
    out = compiled(*inputs)
    torch.manual_seed(3)
    check_attention_grads(lambda q, k, v: fn(q, k, v, attention_dropout), inputs, None, lambda *x: out)
    assert backend.stats["fallbacks"]["aten.randint.low"] == 1, backend.stats


def test_seed_after_vfuses_own_random_op_is_native() -> None:
    """rand_like is vfuse's RAND (its own RNG_SEED, drawn first in graph order): the attention's seed
    is an RNG_SEED too; the same torch seed gives the same result, and no fallback."""
    torch._dynamo.reset()
    inputs = _inputs((1, 2, 1, 19, 11, 8, 8))
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(_after_torch_draw("rand"), backend=backend)
    compiled(*inputs)
    torch.manual_seed(3)
    first = compiled(*inputs)
    torch.manual_seed(3)
    again = compiled(*inputs)
    assert torch.equal(first, again) and not backend.stats["fallbacks"], backend.stats
    assert _ops(backend, Op.RNG_SEED)[0] == 2


def test_other_randint_stays_in_torch() -> None:
    """Only the seed's exact draw is an RNG_SEED: other randints keep torch's numbers (and are counted)."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(lambda x: x + torch.randint(0, 7, (3,)), backend=backend)
    x = torch.zeros(3, dtype=torch.int64)
    compiled(x)
    torch.manual_seed(4)
    got = compiled(x)
    torch.manual_seed(4)
    assert torch.equal(got, x + torch.randint(0, 7, (3,)))
    assert backend.stats["fallbacks"]["aten.randint.low"] == 1, backend.stats
