"""Contraction lowerings: the matmul family -> MATMUL (+ pointwise bias/scales), 2-D
convolution -> CONV2D (+ bias ADD), and every spelling of scaled-dot-product attention -> SDPA.

MATMUL takes rank >= 2 operands, so 1-D operands are reshaped to matrices and the result is
reshaped back, as torch.matmul defines. Transposed or non-2-D convolutions, attention with
dropout, and attention whose logsumexp is read (other than the CPU kernel's, which training
graphs save: lower_attention.py) go to torch.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_attention import sdpa_with_lse
from vfuse.frontend.lower_layout import permute, reshape
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op

aten = torch.ops.aten


def matmul(em: Emitter, a: str, b: str) -> str:
    """torch.matmul semantics (1-D operands included) on top of the rank >= 2 MATMUL."""
    ta, tb = em.ttype(a), em.ttype(b)
    if not ta.dtype.is_float or ta.dtype is not tb.dtype:
        raise Fallback(f"matmul of {ta.dtype.value} and {tb.dtype.value}")
    a2 = reshape(em, a, (1, ta.shape[0])) if ta.rank == 1 else a
    b2 = reshape(em, b, (tb.shape[0], 1)) if tb.rank == 1 else b
    out = em.emit(Op.MATMUL, (a2, b2))
    shape = em.ttype(out).shape
    if ta.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if tb.rank == 1:
        shape = shape[:-1]
    return reshape(em, out, shape)


def scaled(em: Emitter, x: str, factor: Any) -> str:
    return x if factor == 1 else em.emit(Op.MUL, (x, em.scalar(factor, em.ttype(x).dtype)))


@lowers(aten.mm, aten.bmm, aten.matmul, aten.mv, aten.dot, aten.vdot, aten.inner)
def lower_mm(em: Emitter, node: torch.fx.Node) -> str:
    return matmul(em, em.value(node.args[0]), em.value(node.args[1]))


@lowers(aten.addmm, aten.baddbmm, aten.addmv, aten.addbmm)
def lower_addmm(em: Emitter, node: torch.fx.Node) -> str:
    """beta * self + alpha * (a @ b); beta == 0 ignores self entirely (even NaNs), like torch."""
    a = bind(node)
    if a.get("out_dtype") is not None:
        raise Fallback("addmm with out_dtype")
    names = [n for n in a if n not in ("self", "beta", "alpha")]
    prod = matmul(em, em.value(a[names[0]]), em.value(a[names[1]]))
    if node.target.overloadpacket is aten.addbmm:  # type: ignore[union-attr]
        prod = em.emit(Op.SUM, (prod,), axes=(0,), keepdim=False)
    prod = scaled(em, prod, a["alpha"])
    if a["beta"] == 0:
        return prod
    bias = scaled(em, em.cast(em.value(a["self"]), em.ttype(prod).dtype), a["beta"])
    return em.emit(Op.ADD, (bias, prod))


@lowers(aten.linear.default)
def lower_linear(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    w = em.value(a["weight"])
    wt = permute(em, w, (1, 0)) if em.ttype(w).rank == 2 else w
    y = matmul(em, em.value(a["input"]), wt)
    return y if a["bias"] is None else em.emit(Op.ADD, (y, em.value(a["bias"])))


def _pair(v: Any) -> tuple[int, int]:
    v = list(v)
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


@lowers(aten.convolution.default)
def lower_convolution(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x, w = em.value(a["input"]), em.value(a["weight"])
    if a["transposed"] or em.ttype(x).rank != 4 or em.ttype(w).rank != 4:
        raise Fallback("only non-transposed 2-D convolution is lowered")
    if not em.ttype(x).dtype.is_float:
        raise Fallback("integer convolution")
    y = em.emit(
        Op.CONV2D,
        (x, w),
        stride=_pair(a["stride"]),
        padding=_pair(a["padding"]),
        dilation=_pair(a["dilation"]),
        groups=int(a["groups"]),
    )
    if a["bias"] is None:
        return y
    bias = em.cast(em.value(a["bias"]), em.ttype(y).dtype)
    return em.emit(Op.ADD, (y, reshape(em, bias, (1, em.ttype(bias).shape[0], 1, 1))))


def _only_output_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def sdpa(em: Emitter, a: dict[str, Any], mask: Any, gqa: bool | None) -> str:
    """SDPA(q, k, v[, mask]); bool masks keep, float masks add (cast to q's dtype)."""
    if a.get("dropout_p"):
        raise Fallback("attention dropout")
    q, k, v = em.value(a["query"]), em.value(a["key"]), em.value(a["value"])
    tq, tk = em.ttype(q), em.ttype(k)
    inputs = [q, k, v]
    if mask is not None:
        m = em.value(mask)
        inputs.append(m if em.ttype(m).dtype is DType.BOOL else em.cast(m, tq.dtype))
    if gqa is None:  # the internal kernels broadcast k/v heads when q has more
        gqa = tq.rank >= 3 and tq.shape[-3] != tk.shape[-3]
    scale = None if a["scale"] is None else float(a["scale"])
    return em.emit(Op.SDPA, inputs, scale=scale, causal=bool(a["is_causal"]), gqa=bool(gqa))


@lowers(aten.scaled_dot_product_attention.default)
def lower_sdpa(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    return sdpa(em, a, a["attn_mask"], a["enable_gqa"])


@lowers(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
)
def lower_sdpa_internal(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    """The fused kernels return (out, logsumexp, ...): only `out`, or for the CPU kernel in training
    out and logsumexp (SDPA_LSE, frontend/lower_attention.py), have IR equivalents."""
    if not _only_output_used(node):
        if node.target is aten._scaled_dot_product_flash_attention_for_cpu.default:
            return sdpa_with_lse(em, node)
        raise Fallback("attention's logsumexp (or another auxiliary result) is used")
    a = bind(node)
    out = sdpa(em, a, a.get("attn_mask", a.get("attn_bias")), None)
    return (out,) + (None,) * (len(node.meta["val"]) - 1)
