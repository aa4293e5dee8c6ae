"""Attention dropout with symbolic sizes (torch.compile(dynamic=True)): `F.scaled_dot_product_attention`
with dropout becomes vfuse's attention_dropout as with static sizes (the flash templates take run-time
sizes), one compiled forward and backward serving every size; the written-out form with symbolic sizes
is left written out, visibly (its decision's reason), and computes the decomposed dropout's masks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tests.fuzz.graphs_attention import SeededDropout
from tests.training.attention_checks import check_attention_grads
from tests.training.test_attention_backward import _attention_steps

import vfuse
from vfuse.entry.dropout import attention_dropout
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel

# (B, H, HKV, LQ, LK, D) per call: sizes change between calls, D too
SIZES = [(2, 4, 2, 13, 13, 8), (2, 4, 2, 29, 29, 8), (2, 4, 2, 7, 7, 8)]


def _inputs(b: int, h: int, hkv: int, lq: int, lk: int, d: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(lq * 31 + lk)
    sizes = [(b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)]
    return [torch.randn(s, generator=g).requires_grad_() for s in sizes]


def _sdpa(q, k, v, fn=F.scaled_dot_product_attention):
    return fn(q, k, v, dropout_p=0.25, is_causal=True, enable_gqa=True)


def test_sdpa_dropout_with_symbolic_sizes_takes_the_flash_kernels() -> None:
    """Every size: forward and q, k, v gradients as attention_dropout run eagerly with the same torch seed;
    one forward and one backward program (no recompile), both attention kernels native, no fallback."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(_sdpa, backend=backend, dynamic=True)
    for sizes in SIZES:
        inputs = _inputs(*sizes)
        compiled(*inputs)
        torch.manual_seed(9)
        out = compiled(*inputs)
        torch.manual_seed(9)
        check_attention_grads(lambda q, k, v: _sdpa(q, k, v, attention_dropout), inputs, None, lambda *x, out=out: out)
    assert len(backend.compiled) == 2, [c.plan.graph for c in backend.compiled]
    assert [d.rewritten and d.dropout for d in backend.attention] == [0.25]
    steps = _attention_steps(backend)
    assert [type(k) for k in steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD]] == [ContractionKernel] * 2, steps
    assert not backend.stats["fallbacks"], backend.stats


def _written(q, k, v, drop=None):
    """GPT-2's written-out attention, causal by a tril built at the (symbolic) sequence length."""
    n = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(8)  # a constant: sqrt(d) is symbolic, another reason
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    p = F.softmax(s, dim=-1)
    return (F.dropout(p, 0.25, training=True) if drop is None else drop(p, 0.25)) @ v


def test_written_out_with_symbolic_sizes_is_left_written_out() -> None:
    """The matcher takes static sizes only: left written out with the reason recorded; forward and
    gradients as the form run eagerly with entry/dropout.py's mask (the graph's seed, stream 0)."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(_written, backend=backend, dynamic=True)
    for b, h, _, lq, lk, d in SIZES[:1]:
        inputs = _inputs(b, h, h, lq, lk, d)
        compiled(*inputs)
        torch.manual_seed(4)
        out = compiled(*inputs)
        torch.manual_seed(4)
        check_attention_grads(lambda q, k, v: _written(q, k, v, SeededDropout()), inputs, None, lambda *x, out=out: out)
    assert backend.attention and not any(d.rewritten for d in backend.attention)
    assert all("symbolic sizes" in d.reason for d in backend.attention), [d.text() for d in backend.attention]
    assert not backend.stats["fallbacks"], backend.stats
