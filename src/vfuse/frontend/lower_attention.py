"""Attention for training: AOTAutograd's CPU flash attention forward (whose logsumexp the backward
reads) -> SDPA_LSE, and its backward -> SDPA_BACKWARD (ir/defs/attention_grad.py).

Both IR ops return one flat tensor that is sliced here into the values torch's ops return.
`delta = rowsum(grad_out * out)`, which the backward needs per query row, is computed with
primitives (the planner makes it a row kernel). Attention with dropout arrives as vfuse's own op pair
(frontend/attention_ops.py) and lowers to the same IR ops with attrs dropout and stream and the seed as
their last input: the kernels draw the mask from vfuse's counter RNG. Non-fp32 attention stays in torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from vfuse.frontend import attention_ops  # noqa: F401  (defines torch.ops.vfuse.*)
from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import reshape, slice_
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op
from vfuse.ir.defs.attention_grad import grad_sizes, lse_sizes

aten = torch.ops.aten


def _attention_inputs(em: Emitter, a: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """The IR values of `names`, plus the mask (float masks cast to fp32, bool masks keep)."""
    if a.get("dropout_p"):
        raise Fallback("attention dropout")  # torch's op with its own RNG: the rewrite replaces these
    values = [em.value(a[n]) for n in names]
    bad = [f"{n} {em.ttype(v)}" for n, v in zip(names, values, strict=True) if em.ttype(v).dtype is not DType.F32]
    if bad:
        raise Fallback(f"training attention is fp32 only, got {', '.join(bad)}")
    mask = a.get("attn_mask", a.get("mask"))
    if mask is not None:
        m = em.value(mask)
        values.append(m if em.ttype(m).dtype is DType.BOOL else em.cast(m, DType.F32))
    return values


def _attrs(em: Emitter, a: dict[str, Any], q: str, k: str) -> dict[str, Any]:
    tq, tk = em.ttype(q), em.ttype(k)
    gqa = tq.rank >= 3 and tq.shape[-3] != tk.shape[-3]
    scale = None if a["scale"] is None else float(a["scale"])
    causal = a["is_causal"] if "is_causal" in a else a["causal"]
    return dict(scale=scale, causal=bool(causal), gqa=bool(gqa))


def _dropout(em: Emitter, a: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """vfuse's op pair: ([the seed], attrs dropout and stream); 0 < p < 1 (the rewrite's)."""
    p = float(a["p"])
    if not 0.0 < p < 1.0:
        raise Fallback(f"attention dropout {p} outside (0, 1)")
    return [em.value(a["seed"])], dict(dropout=p, stream=int(a["stream"]))


def _pieces(em: Emitter, flat: str, shapes: list[tuple[int, ...]], sizes: tuple[int, ...]) -> tuple[str, ...]:
    """The consecutive row-major pieces of a flat tensor, each viewed as its shape."""
    out, start = [], 0
    for shape, n in zip(shapes, sizes, strict=True):
        out.append(reshape(em, slice_(em, flat, 0, start, start + n), shape))
        start += n
    return tuple(out)


def sdpa_with_lse(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    """`_scaled_dot_product_flash_attention_for_cpu` whose logsumexp is read: (out, lse)."""
    a = bind(node)
    return _lse(em, node, a, _attention_inputs(em, a, ("query", "key", "value")), {})


@lowers(torch.ops.vfuse.flash_attention_dropout.default)
def lower_attention_dropout(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    """vfuse's attention with dropout (entry/attention_rewrite.py): (out, lse), the mask drawn in the kernel."""
    a = bind(node)
    seed, drop = _dropout(em, a)
    return _lse(em, node, a, _attention_inputs(em, a, ("q", "k", "v")) + seed, drop)


def _lse(em: Emitter, node: torch.fx.Node, a: dict[str, Any], inputs: list[str], drop: dict[str, Any]) -> tuple:
    q, k, v = inputs[:3]
    flat = em.emit(Op.SDPA_LSE, inputs, **_attrs(em, a, q, k), **drop)
    qs, vs = em.ttype(q).shape, em.ttype(v).shape
    out, lse = _pieces(em, flat, [qs[:-1] + vs[-1:], qs[:-1]], lse_sizes(qs, vs))
    return (out, lse) + (None,) * (len(node.meta["val"]) - 2)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def lower_sdpa_backward(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    """(grad_query, grad_key, grad_value) from the saved output and logsumexp (FlashAttention-2)."""
    a = bind(node)
    names = ("grad_out", "query", "key", "value", "out", "logsumexp")
    return _backward(em, a, _attention_inputs(em, a, names), [], {})


@lowers(torch.ops.vfuse.flash_attention_dropout_backward.default)
def lower_attention_dropout_backward(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    """The backward of vfuse's attention with dropout: the forward's mask regenerated from the seed."""
    a = bind(node)
    seed, drop = _dropout(em, a)
    names = ("grad_out", "q", "k", "v", "out", "lse")
    return _backward(em, a, _attention_inputs(em, a, names), seed, drop)


def _backward(em: Emitter, a: dict[str, Any], inputs: list[str], seed: list[str], drop: dict[str, Any]) -> tuple:
    do, q, k, v, out, lse, *mask = inputs
    tq = em.ttype(q)
    delta = em.emit(Op.SUM, (em.emit(Op.MUL, (do, out)),), axes=(tq.rank - 1,), keepdim=False)
    qs, ks, vs = tq.shape, em.ttype(k).shape, em.ttype(v).shape
    # Equal shapes: typed [3, *q.shape], so the qkv gradient's stack is this value (same bytes).
    stacked = qs == ks == vs
    ins = [do, q, k, v, lse, delta, *mask, *seed]
    out = em.emit(Op.SDPA_BACKWARD, ins, **_attrs(em, a, q, k), **drop, stacked=stacked)
    if stacked:
        return tuple(reshape(em, slice_(em, out, 0, i, i + 1), qs) for i in range(3))
    return _pieces(em, out, [qs, ks, vs], grad_sizes(qs, ks, vs))
