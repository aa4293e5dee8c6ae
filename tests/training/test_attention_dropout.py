"""Training attention with dropout through vfuse's flash kernels (entry/attention_rewrite.py,
frontend/attention_ops.py, the templates' VF_DROPOUT): the mask is vfuse's counter RNG at the scores'
flat index, drawn in the forward kernel and again in the backward, never stored.

vfuse's mask is not eager torch's (another generator), so numerics are checked against an eager
reference with vfuse's own mask: `attention_dropout` run eagerly (the IR references), itself checked
against plain torch autograd over a mask computed here from `ir.defs.rng.uniform`. The compiled
graph's first draw is the seed, so the same torch seed gives the reference the same mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.models.zoo import GPT2Block
from tests.training.attention_checks import check_attention_grads
from torch import nn

import vfuse
from vfuse.entry.dropout import attention_dropout
from vfuse.ir.defs.random import SEED_HIGH
from vfuse.ir.defs.rng import uniform

# (id, (B, H, HKV, LQ, LK, D, DV), causal, mask: None | "bool" | "additive")
CASES = [
    ("causal-gqa-Lq37-Lk23-d5", (2, 4, 2, 37, 23, 5, 5), True, None),
    ("full-Lq7-Lk131-d8-dv3", (1, 2, 2, 7, 131, 8, 3), False, None),
    ("causal-L67-d20", (1, 3, 3, 67, 67, 20, 20), True, None),
    ("bool-mask-L41-Lk29-d12", (2, 2, 1, 41, 29, 12, 12), False, "bool"),
    ("additive-mask-L17-d64", (1, 2, 2, 17, 17, 64, 64), False, "additive"),
    ("one-key", (1, 1, 1, 5, 1, 8, 8), False, None),
]


def _inputs(shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    b, h, hkv, lq, lk, d, dv = shape
    g = torch.Generator().manual_seed(seed)
    sizes = [(b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)]
    return [torch.randn(s, generator=g).requires_grad_() for s in sizes]


def _mask(kind: str | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    b, h, _, lq, lk, _, _ = shape
    g = torch.Generator().manual_seed(3)
    if kind == "bool":
        keep = torch.rand(b, 1, lq, lk, generator=g) > 0.3
        keep[..., 0] = True  # every row keeps a key
        return keep
    if kind == "additive":
        return torch.randn(1, h, lq, lk, generator=g)
    return None


def _sdpa(p: float, causal: bool, mask: torch.Tensor | None, fn=F.scaled_dot_product_attention):
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fn(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, enable_gqa=True)

    return attend


def _math_reference(q, k, v, mask, seed: torch.Tensor, p: float, causal: bool, stream: int = 0) -> torch.Tensor:
    """Plain torch autograd: softmax, vfuse's mask (rng.uniform at the scores' flat index), @ v."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    keep = uniform(seed, stream, s.numel()).view(s.shape) >= p
    return (torch.softmax(s, -1) * keep / (1 - p)) @ v


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eager_op_is_the_math_with_vfuses_mask(case) -> None:
    _, shape, causal, kind = case
    q, k, v = _inputs(shape)
    mask, seed, p = _mask(kind, shape), torch.tensor((3 << 40) + 12345), 0.3
    out, _ = torch.ops.vfuse.flash_attention_dropout(q, k, v, mask, seed, p, causal, None, 2)
    check_attention_grads(lambda *x: _math_reference(*x, mask, seed, p, causal, 2), [q, k, v], None, lambda *x: out)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_compiled_matches_the_reference_with_vfuses_mask(case) -> None:
    """Forward and gradients of q, k, v within 1e-4 of eager attention_dropout with the same seed."""
    torch._dynamo.reset()
    _, shape, causal, kind = case
    inputs, mask = _inputs(shape), _mask(kind, shape)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(_sdpa(0.2, causal, mask), backend=backend)
    compiled(*inputs)  # compiled: the next call's only draw from torch's generator is its seed
    torch.manual_seed(7)
    out = compiled(*inputs)
    torch.manual_seed(7)
    check_attention_grads(_sdpa(0.2, causal, mask, attention_dropout), inputs, None, lambda *x: out)
    assert [d.rewritten and d.dropout == 0.2 for d in backend.attention] == [True]
    assert not backend.stats["fallbacks"], backend.stats  # the seed's draw is an RNG_SEED too


def test_p_zero_stays_torchs_flash_path() -> None:
    torch._dynamo.reset()
    inputs = _inputs((1, 2, 2, 13, 13, 8, 8))
    backend = vfuse.backend(strict=True)
    check_attention_grads(_sdpa(0.0, True, None), inputs, backend)
    assert backend.attention == [] and not backend.stats["fallbacks"]


def test_keep_rate_scale_and_seeds() -> None:
    """With v = I the output is P Z: about 1 - p of it kept, kept values P / (1 - p) exactly in fp32
    terms, the same seed the same mask, another seed another mask."""
    torch._dynamo.reset()
    b, h, lq, lk, p = 2, 3, 61, 64, 0.1
    q, k = torch.randn(b, h, lq, 16), torch.randn(b, h, lk, 16)
    v = torch.eye(lk).expand(b, h, lk, lk).contiguous()
    q.requires_grad_()
    compiled = torch.compile(_sdpa(p, False, None), backend=vfuse.backend(strict=True))
    compiled(q, k, v)
    torch.manual_seed(11)
    first = compiled(q, k, v).detach()
    torch.manual_seed(11)
    again = compiled(q, k, v).detach()
    other = compiled(q, k, v).detach()
    assert torch.equal(first, again)
    dropped = (first == 0).double().mean().item()
    assert abs(dropped - p) < 4 * math.sqrt(p * (1 - p) / first.numel()), dropped
    assert 0.5 < ((other == 0) != (first == 0)).double().mean().item() / (2 * p * (1 - p)) < 1.5
    probs = torch.softmax(q.detach() @ k.transpose(-1, -2) / 4, -1)
    kept = first != 0
    torch.testing.assert_close(first[kept], (probs / (1 - p))[kept], rtol=1e-5, atol=1e-7)


def test_the_mask_is_the_seeds_hash() -> None:
    """The kept pattern is `uniform(seed, 0, flat index) >= p` for the seed the graph drew."""
    torch._dynamo.reset()
    b, h, lq, lk, p = 1, 2, 9, 33, 0.4
    q, k = torch.randn(b, h, lq, 8), torch.randn(b, h, lk, 8)
    v = torch.eye(lk).expand(b, h, lk, lk).contiguous()
    compiled = torch.compile(_sdpa(p, True, None), backend=vfuse.backend(strict=True))
    compiled(q, k, v)
    torch.manual_seed(5)
    out = compiled(q, k, v)
    torch.manual_seed(5)
    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64)
    keep = uniform(seed, 0, out.numel()).view(out.shape) >= p
    causal = torch.ones(lq, lk, dtype=torch.bool).tril()
    assert torch.equal(out != 0, keep & causal)


def _saved(fn, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs).sum().backward()
    return saved


def test_backward_keeps_no_n_by_n_tensor() -> None:
    """Saved for the backward: q, k, v, the output, the logsumexp and the 8-byte seed (O(N)); eager's
    math path keeps the L x L probabilities and mask."""
    torch._dynamo.reset()
    b, h, hkv, lq, d = 1, 4, 2, 97, 8
    inputs = _inputs((b, h, hkv, lq, lq, d, d))
    backend = vfuse.backend(strict=True)
    saved = _saved(torch.compile(_sdpa(0.1, True, None), backend=backend), inputs)
    nbytes = sum(t.numel() * t.element_size() for t in saved)
    q_bytes, kv_bytes = b * h * lq * d * 4, b * hkv * lq * d * 4
    assert nbytes == 2 * q_bytes + 2 * kv_bytes + b * h * lq * 4 + 8 == backend.stats["saved_bytes"]
    assert max(t.numel() for t in saved) < lq * lq
    eager = _saved(_sdpa(0.1, True, None), inputs)
    assert max(t.numel() for t in eager) >= b * h * lq * lq


class WrittenOut(nn.Module):
    """HF eager attention: softmax -> nn.Dropout -> @ v, causal by a tril buffer."""

    def __init__(self, p: float, fn=None) -> None:
        super().__init__()
        self.drop, self.fn = nn.Dropout(p), fn
        self.register_buffer("tril", torch.ones(31, 31, dtype=torch.bool).tril())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.fn is not None:
            return self.fn(q, k, v, dropout_p=self.drop.p, is_causal=True, scale=0.125)
        lq = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) * 0.125
        s = s.masked_fill(~self.tril[:lq, :lq], float("-inf"))
        return self.drop(F.softmax(s, dim=-1)) @ v


def test_written_out_attention_with_dropout_is_rewritten() -> None:
    torch._dynamo.reset()
    inputs = _inputs((2, 3, 3, 29, 29, 16, 16))
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(WrittenOut(0.15), backend=backend)
    compiled(*inputs)
    torch.manual_seed(3)
    out = compiled(*inputs)
    torch.manual_seed(3)
    check_attention_grads(WrittenOut(0.15, attention_dropout), inputs, None, lambda *x: out)
    (d,) = backend.attention
    assert d.rewritten and d.dropout == 0.15 and d.causal and "attention_dropout" in d.text(), d.text()


def test_gpt2_block_with_dropout_keeps_no_t_by_t_tensor() -> None:
    """GPT-2's block with attn_pdrop 0.1 trains through the flash kernels: finite gradients, and what
    the backward keeps holds no T x T tensor (the math path kept probabilities and mask)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    t = 53
    model, x = GPT2Block(d=32, heads=4, dropout=0.1), torch.randn(2, t, 32)
    backend = vfuse.backend(strict=True)
    saved = _saved(torch.compile(model, backend=backend), [x])
    assert [d.rewritten and d.dropout for d in backend.attention] == [0.1]
    assert max(t_.numel() for t_ in saved) < 2 * 4 * t * t
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in model.parameters())


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_gpt2_with_attn_pdrop_takes_the_flash_kernels(impl: str) -> None:
    """HF GPT-2 in train mode with attn_pdrop 0.1: its eager attention (softmax -> nn.Dropout -> matmul)
    and its SDPA attention (dropout_p) are both rewritten; nothing runs in torch (the seeds are RNG_SEEDs)."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    sizes = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 53}
    drops = {"attn_pdrop": 0.1, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
    config = transformers.GPT2Config(**sizes, **drops, attn_implementation=impl)
    model, x = transformers.GPT2LMHeadModel(config).train(), torch.randint(0, 53, (2, 19))
    backend = vfuse.backend()
    torch.compile(model, backend=backend)(x, labels=x).loss.backward()
    assert [d.rewritten and d.dropout for d in backend.attention] == [0.1, 0.1], [d.text() for d in backend.attention]
    assert not backend.stats["fallbacks"] and backend.stats["eager_graphs"] == 0, backend.stats
    assert all(p.grad is None or bool(p.grad.isfinite().all()) for p in model.parameters())
