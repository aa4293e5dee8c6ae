"""fuse_attention: real attention spellings (traced from torch) become exactly one SDPA node,
numerics unchanged vs eager; chains with escaping intermediates or inexact masks are left alone."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.models.zoo import GPT2Block
from torch.func import functional_call

from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, format_graph, verify
from vfuse.passes import canonicalize, cse, dce
from vfuse.passes.attention import fuse_attention

B, H, T, D = 2, 4, 12, 16
NEG = torch.finfo(torch.float32).min


def _ir(fn: Callable, inputs: Sequence[torch.Tensor], opt: bool = True) -> Graph:
    """The IR the attention pass sees in the pipeline (which itself includes the pass)."""
    g = lower(trace_aten(fn, inputs), Context())
    return dce(cse(canonicalize(g))) if opt else g


def _fuse(fn: Callable, inputs: Sequence[torch.Tensor], opt: bool = True) -> Graph:
    """Trace, rewrite, check: one SDPA, both attention MATMULs gone, outputs equal eager's."""
    before = _ir(fn, inputs, opt)
    g = verify(fuse_attention(before))
    ops = [n.op for n in g.compute_nodes]
    n_mm = [n.op for n in before.compute_nodes].count(Op.MATMUL)
    assert ops.count(Op.SDPA) == 1 and ops.count(Op.MATMUL) == n_mm - 2, format_graph(g)
    want = fn(*inputs)
    torch.testing.assert_close(run(g, inputs)[0], want, rtol=1e-4, atol=1e-5)
    return g


def _sdpa(g: Graph) -> dict:
    (node,) = [n for n in g.nodes if n.op is Op.SDPA]
    return {**dict(node.attrs), "n_inputs": len(node.inputs)}


def _qkv(heads_kv: int = H, lq: int = T) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, H, lq, D), torch.randn(B, heads_kv, T, D), torch.randn(B, heads_kv, T, D)]


def gpt2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF GPT-2 eager attention: bool tril buffer sliced, where(.., finfo.min)."""
    bias = torch.tril(torch.ones(32, 32, dtype=torch.bool)).view(1, 1, 32, 32)
    w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
    lq, lk = q.size(-2), k.size(-2)
    w = torch.where(bias[:, :, lk - lq : lk, :lk], w, torch.full([], NEG, dtype=w.dtype))
    return torch.matmul(torch.softmax(w, dim=-1), v)


def test_gpt2_causal_where_finfo_min_becomes_causal_sdpa() -> None:
    g = _fuse(gpt2, _qkv())
    assert _sdpa(g) == {"causal": True, "gqa": False, "scale": 0.25, "n_inputs": 3}


def test_masked_fill_minus_inf_triu_and_unoptimized_graph() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        s = (q @ k.transpose(-2, -1)).masked_fill(mask, float("-inf")) * D**-0.5
        return s.softmax(-1) @ v

    assert _sdpa(_fuse(fn, _qkv(), opt=False))["causal"] is True


def test_bert_additive_padding_mask() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        ext = (1.0 - keep[:, None, None, :]) * NEG
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D) + ext
        return torch.matmul(torch.nn.functional.softmax(s, dim=-1), v)

    keep = torch.ones(B, T)
    keep[0, -3:] = 0
    g = _fuse(fn, [*_qkv(), keep])
    assert _sdpa(g) == {"causal": False, "gqa": False, "scale": 0.25, "n_inputs": 4}


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    b, h, t, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def test_llama_gqa_causal_additive_mask_from_iota() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        i = torch.arange(T)
        causal = torch.where(i[None, :] > i[:, None], NEG, 0.0)[None, None]
        s = torch.matmul(q, repeat_kv(k, 2).transpose(2, 3)) * D**-0.5 + causal
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, repeat_kv(v, 2)).transpose(1, 2).contiguous()

    g = _fuse(fn, _qkv(heads_kv=H // 2))
    assert _sdpa(g) == {"causal": True, "gqa": True, "scale": 0.25, "n_inputs": 3}


def test_scale_before_matmul_and_projections_from_linear() -> None:
    def fn(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(B, T, H, D).transpose(1, 2)

        q, k, v = heads(x @ wq) * D**-0.5, heads(x @ wk), heads(x @ wv)
        return (torch.softmax(q @ k.transpose(-1, -2), -1) @ v).transpose(1, 2).reshape(B, T, H * D)

    weights = [torch.randn(H * D, H * D) * 0.1 for _ in range(3)]  # parameters lifted to inputs
    assert _sdpa(_fuse(fn, [torch.randn(B, T, H * D), *weights]))["scale"] == pytest.approx(0.25)


def test_softmax_without_max_shift_and_old_gpt2_key_permute() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kt = k.permute(0, 2, 3, 1)  # k is [B, T, H, D]: K^T straight from the head split
        e = torch.exp(q @ kt / 4.0)
        return (e / e.sum(-1, keepdim=True)) @ v

    q, k, v = _qkv()
    _fuse(fn, [q, k.transpose(1, 2).contiguous(), v])


def test_causal_plus_padding_masks_are_summed_not_flagged() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        s = (q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")) + pad
        return torch.softmax(s / 4.0, -1) @ v

    pad = torch.zeros(B, 1, 1, T)
    pad[1, ..., -2:] = NEG
    g = _fuse(fn, [*_qkv(), pad])
    assert _sdpa(g) == {"causal": False, "gqa": False, "scale": 0.25, "n_inputs": 4}


def test_bool_padding_mask_stays_a_bool_keep_mask() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        s = torch.where(keep, q @ k.transpose(-1, -2), float("-inf"))
        return torch.softmax(s, -1) @ v

    keep = torch.rand(B, 1, T, T) > 0.3
    keep[..., 0] = True  # no fully masked row: eager would give NaN there, SDPA zeros
    g = _fuse(fn, [*_qkv(), keep])
    (sd,) = [n for n in g.nodes if n.op is Op.SDPA]
    assert g[sd.inputs[3]].type == TensorType((B, 1, T, T), DType.BOOL)


def test_left_alone_when_intermediates_escape_or_masks_are_inexact() -> None:
    def probs_returned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return p @ v, p

    def moderate_fill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(T, T).tril() == 0
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(mask, -1e9), -1) @ v

    def train_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # dropout's lowered form (a keep mask from uniform noise, rescaled) between softmax and @ v
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return (p * (u >= 0.1).to(p.dtype) / 0.9) @ v

    for fn in (probs_returned, moderate_fill, train_dropout):
        g = _ir(fn, [*_qkv(), torch.rand(B, H, T, T)][: fn.__code__.co_argcount])
        assert fuse_attention(g) is g, fn.__name__


def test_hand_built_graph_exact_structure() -> None:
    """q * c @ permute(k) with an additive mask after the scale: the mask is not rescaled."""
    f32 = DType.F32
    b = GraphBuilder()
    q = b.add(Op.INPUT, name="q", index=0, type=TensorType((2, 3, 8, 4), f32))
    k = b.add(Op.INPUT, name="k", index=1, type=TensorType((2, 3, 8, 4), f32))
    v = b.add(Op.INPUT, name="v", index=2, type=TensorType((2, 3, 8, 4), f32))
    m = b.add(Op.INPUT, name="m", index=3, type=TensorType((2, 1, 1, 8), f32))
    qs = b.add(Op.MUL, [q, b.add(Op.FULL, value=0.5, shape=(), dtype=f32)])
    s = b.add(Op.MATMUL, [qs, b.add(Op.PERMUTE, [k], perm=(0, 1, 3, 2))])
    s = b.add(Op.ADD, [b.add(Op.DIV, [s, b.add(Op.FULL, value=2.0, shape=(), dtype=f32)]), m])
    mx = b.add(Op.AMAX, [s], axes=(3,), keepdim=True)
    e = b.add(Op.EXP, [b.add(Op.SUB, [s, mx])])
    p = b.add(Op.DIV, [e, b.add(Op.SUM, [e], axes=(3,), keepdim=True)])
    g = verify(b.build([b.add(Op.MATMUL, [p, v])]))
    fused = verify(fuse_attention(g))
    assert format_graph(fused, canonical=True) == (
        "graph(%0: f32[2,3,8,4], %1: f32[2,3,8,4], %2: f32[2,3,8,4], %3: f32[2,1,1,8]) {\n"
        "  %4 = sdpa(%0, %1, %2, %3) {causal=False, gqa=False, scale=0.25} : f32[2,3,8,4]\n"
        "  return (%4)\n"
        "}"
    )
    ins = [torch.randn(2, 3, 8, 4) for _ in range(3)] + [torch.randn(2, 1, 1, 8)]
    torch.testing.assert_close(run(fused, ins)[0], run(g, ins)[0], rtol=1e-4, atol=1e-5)


def test_two_layers_rewrite_independently() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v
        return torch.softmax(o @ k.transpose(-1, -2) / 4.0, -1) @ v

    g = verify(fuse_attention(_ir(fn, _qkv())))
    assert [n.op for n in g.compute_nodes] == [Op.SDPA, Op.SDPA]
    torch.testing.assert_close(run(g, _qkv())[0], fn(*_qkv()), rtol=1e-4, atol=1e-5)


def test_cross_attention_lq_differs_from_lk_keeps_non_causal_constant_mask() -> None:
    """A constant mask that is not top-left causal (here bottom-right, as in a decode step)
    stays an explicit mask input."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        lq, lk = q.shape[-2], k.shape[-2]
        keep = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        s = torch.where(keep, q @ k.transpose(-1, -2), float("-inf"))
        return torch.softmax(s, -1) @ v

    g = _fuse(fn, _qkv(lq=5))
    assert _sdpa(g) == {"causal": False, "gqa": False, "scale": 1.0, "n_inputs": 4}


def test_zoo_gpt2_block_attention_becomes_causal_sdpa() -> None:
    model, x = GPT2Block().eval(), torch.randn(2, 16, 64)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def fn(x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        return functional_call(model, dict(zip(state, tensors, strict=True)), (x,))

    g = _fuse(fn, [x, *state.values()])
    assert _sdpa(g) == {"causal": True, "gqa": False, "scale": 0.25, "n_inputs": 3}


def _spelling(scale_at: str, mask: str, shift: bool, gqa: bool, bmm: bool) -> Callable:
    """One attention spelling out of the combinations the property test draws."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        k, v = (repeat_kv(k, 2), repeat_kv(v, 2)) if gqa else (k, v)
        q = q * 0.5 if scale_at == "q" else q
        kt = (k * 0.5).transpose(-1, -2) if scale_at == "k" else k.transpose(-1, -2)
        s = torch.bmm(q.reshape(-1, T, D), kt.reshape(-1, D, T)).view(B, H, T, T) if bmm else q @ kt
        s = s / 2.0 if scale_at == "scores" else s
        i = torch.arange(T)
        if mask == "additive":
            s = s + pad
        elif mask == "tril_inf":
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        elif mask == "iota_finfo_min":
            s = torch.where(i[:, None] >= i[None, :], s, NEG)
        s = s * 0.5 if scale_at == "after_mask" else s
        if shift:
            p = torch.softmax(s, -1)
        else:
            e = torch.exp(s)
            p = e / e.sum(-1, keepdim=True)
        return torch.bmm(p.reshape(-1, T, T), v.reshape(-1, T, D)).view(B, H, T, D) if bmm else p @ v

    return fn


@settings(max_examples=24, deadline=None)
@given(
    st.sampled_from(["none", "q", "k", "scores", "after_mask"]),
    st.sampled_from(["none", "additive", "tril_inf", "iota_finfo_min"]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_any_combination_of_spellings_fuses(scale_at: str, mask: str, shift: bool, gqa: bool, bmm: bool) -> None:
    pad = torch.zeros(B, 1, 1, T)
    pad[0, ..., -4:] = NEG
    g = _fuse(_spelling(scale_at, mask, shift, gqa, bmm), [*_qkv(heads_kv=H // 2 if gqa else H), pad])
    attrs = _sdpa(g)
    assert attrs["causal"] == (mask in ("tril_inf", "iota_finfo_min"))
    assert attrs["gqa"] == gqa and attrs["n_inputs"] == (4 if mask == "additive" else 3)
    assert attrs["scale"] == pytest.approx(0.5 if scale_at != "none" else 1.0)


def test_bf16_model_with_fp32_softmax_between_casts() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, repeat_kv(k, 2).transpose(2, 3)) * D**-0.5
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, repeat_kv(v, 2))

    inputs = [t.to(torch.bfloat16) for t in _qkv(heads_kv=H // 2)]
    g = verify(fuse_attention(_ir(fn, inputs)))
    assert [n.op for n in g.compute_nodes] == [Op.SDPA]
    assert _sdpa(g) == {"causal": True, "gqa": True, "scale": 0.25, "n_inputs": 3}
    # bf16 rounds scores and probabilities in eager; compare at bf16 resolution
    torch.testing.assert_close(run(g, inputs)[0], fn(*inputs), rtol=2e-2, atol=2e-2)
