"""Differential fuzzing of training attention with dropout (frontend/attention_ops.py, the flash
templates' dropout): random sizes (primes, 1, grouped heads, Lq != Lk, D not a multiple of 8), causal
or not, no / boolean / additive mask, random p. Eager torch draws another mask, so the reference is
`attention_dropout` run eagerly (the IR references with vfuse's mask, itself checked against plain
autograd in tests/training/test_attention_dropout.py) with the same torch seed: forward and q, k, v
gradients. `make test` draws the same cases every run; `make fuzz` draws new ones (tests/fuzz/soak.py)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import fuzz_settings
from tests.training.attention_checks import check_attention_grads
from tests.training.test_attention_dropout import _sdpa

import vfuse
from vfuse.entry.dropout import attention_dropout

EXAMPLES = 3


@st.composite
def _cases(draw: Any) -> tuple[list[torch.Tensor], torch.Tensor | None, bool, float]:
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))
    lq, lk = draw(st.sampled_from([1, 5, 17, 31])), draw(st.sampled_from([1, 7, 23, 40]))
    d, dv = draw(st.sampled_from([3, 8, 13])), draw(st.sampled_from([3, 8, 13]))
    causal, kind, p = (
        draw(st.booleans()),
        draw(st.sampled_from([None, "bool", "additive"])),
        draw(st.sampled_from([0.1, 0.5])),
    )
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    sizes = [(b, hkv * group, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)]
    inputs = [torch.randn(s, generator=g).requires_grad_() for s in sizes]
    mask = None
    if kind == "bool":
        mask = torch.rand(b, 1, lq, lk, generator=g) > 0.3
        mask[..., 0] = True  # every row keeps a key (a fully masked row is NaN in eager)
    elif kind == "additive":
        mask = torch.randn(1, hkv * group, lq, lk, generator=g)
    return inputs, mask, causal and mask is None, p  # sdpa takes a mask or is_causal, not both


@fuzz_settings(EXAMPLES)
@given(case=_cases())
def test_attention_dropout_matches_the_reference_with_vfuses_mask(case: Any) -> None:
    inputs, mask, causal, p = case
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(_sdpa(p, causal, mask), backend=backend)
    compiled(*inputs)  # compiled: the next call's only draw from torch's generator is its seed
    torch.manual_seed(11)
    out = compiled(*inputs)
    torch.manual_seed(11)
    check_attention_grads(_sdpa(p, causal, mask, attention_dropout), inputs, None, lambda *x: out)
    assert [d.rewritten for d in backend.attention] == [True]
