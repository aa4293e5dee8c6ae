"""Attention for training: AOTAutograd's CPU flash attention forward (whose logsumexp the backward
reads) -> SDPA_LSE, and its backward -> SDPA_BACKWARD (ir/defs/attention_grad.py).

Both IR ops return one flat tensor that is sliced here into the values torch's ops return.
`delta = rowsum(grad_out * out)`, which the backward needs per query row, is computed with
primitives (the planner makes it a row kernel). Dropout and non-fp32 attention stay in torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

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
        raise Fallback("attention dropout")
    values = [em.value(a[n]) for n in names]
    bad = [f"{n} {em.ttype(v)}" for n, v in zip(names, values, strict=True) if em.ttype(v).dtype is not DType.F32]
    if bad:
        raise Fallback(f"training attention is fp32 only, got {', '.join(bad)}")
    if a.get("attn_mask") is not None:
        m = em.value(a["attn_mask"])
        values.append(m if em.ttype(m).dtype is DType.BOOL else em.cast(m, DType.F32))
    return values


def _attrs(em: Emitter, a: dict[str, Any], q: str, k: str) -> dict[str, Any]:
    tq, tk = em.ttype(q), em.ttype(k)
    gqa = tq.rank >= 3 and tq.shape[-3] != tk.shape[-3]
    scale = None if a["scale"] is None else float(a["scale"])
    return dict(scale=scale, causal=bool(a["is_causal"]), gqa=bool(gqa))


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
    inputs = _attention_inputs(em, a, ("query", "key", "value"))
    q, k, v = inputs[:3]
    flat = em.emit(Op.SDPA_LSE, inputs, **_attrs(em, a, q, k))
    qs, vs = em.ttype(q).shape, em.ttype(v).shape
    out, lse = _pieces(em, flat, [qs[:-1] + vs[-1:], qs[:-1]], lse_sizes(qs, vs))
    return (out, lse) + (None,) * (len(node.meta["val"]) - 2)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def lower_sdpa_backward(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    """(grad_query, grad_key, grad_value) from the saved output and logsumexp (FlashAttention-2)."""
    a = bind(node)
    names = ("grad_out", "query", "key", "value", "out", "logsumexp")
    do, q, k, v, out, lse, *mask = _attention_inputs(em, a, names)
    tq = em.ttype(q)
    delta = em.emit(Op.SUM, (em.emit(Op.MUL, (do, out)),), axes=(tq.rank - 1,), keepdim=False)
    qs, ks, vs = tq.shape, em.ttype(k).shape, em.ttype(v).shape
    # Equal shapes: typed [3, *q.shape], so the qkv gradient's stack is this value (same bytes).
    stacked = qs == ks == vs
    out = em.emit(Op.SDPA_BACKWARD, [do, q, k, v, lse, delta, *mask], **_attrs(em, a, q, k), stacked=stacked)
    if stacked:
        return tuple(reshape(em, slice_(em, out, 0, i, i + 1), qs) for i in range(3))
    return _pieces(em, out, [qs, ks, vs], grad_sizes(qs, ks, vs))
