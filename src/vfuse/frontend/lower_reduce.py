"""Reduction lowerings: sum, prod, mean, amax/amin, max/min (values and indices), argmax/argmin,
any/all, var/std (with correction), var_mean/std_mean and logsumexp.

torch's "no dims means all dims" is resolved here into explicit sorted axes. mean and var are
decomposed into SUM and pointwise ops (so the planner fuses them as row kernels); fp16/bf16
statistics are accumulated in fp32 like torch does, then cast back.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op
from vfuse.ir.shapes import normalize_dims
from vfuse.ir.sym import is_sym, smax

aten = torch.ops.aten


def acc_dtype(dtype: DType) -> DType:
    """The dtype statistics of `dtype` values are accumulated in (fp32 for half types)."""
    return DType.F32 if dtype in (DType.F16, DType.BF16) else dtype


def axes_of(em: Emitter, x: str, dim: Any) -> tuple[int, ...]:
    """Sorted non-negative axes; None, [] and a missing dim all mean every dim (torch's rule)."""
    if isinstance(dim, int):
        dim = [dim]
    return normalize_dims(dim, em.ttype(x).rank)


def count(em: Emitter, x: str, axes: tuple[int, ...]) -> int:
    return math.prod(em.ttype(x).shape[a] for a in axes)


def reduce(em: Emitter, op: Op, x: str, axes: tuple[int, ...], keepdim: bool) -> str:
    if op in (Op.AMAX, Op.AMIN) and count(em, x, axes) == 0:
        raise Fallback("max/min over an empty dim")  # no identity element; torch raises too
    return em.emit(op, (x,), axes=axes, keepdim=keepdim)


def mean(em: Emitter, x: str, axes: tuple[int, ...], keepdim: bool) -> str:
    """SUM / count in the accumulation dtype of x (the caller casts the result back)."""
    x = em.cast(x, acc_dtype(em.ttype(x).dtype))
    total = em.emit(Op.SUM, (x,), axes=axes, keepdim=keepdim)
    return em.emit(Op.DIV, (total, em.scalar(count(em, x, axes), em.ttype(x).dtype)))


class Moments(NamedTuple):
    """var follows `keepdim`; mean keeps the reduced dims (size 1); centered = x - mean."""

    var: str
    mean: str
    centered: str


def variance(em: Emitter, x: str, axes: tuple[int, ...], correction: float, keepdim: bool) -> Moments:
    """The corrected two-pass algorithm (Chan, Golub & LeVeque 1983): with m = sum(x) / N and
    d = x - m, mean = m + sum(d) / N and sum((x - mean)^2) = sum(d^2) - sum(d)^2 / N (never below
    0), divided by max(0, N - correction) like torch; x - mean, taken as d - sum(d) / N, is kept so
    that normalizations reuse it. The correction costs one more sum in the pass that squares d: the
    mean is then as accurate as one rounding allows, and exact over a constant row (every d is the
    same -ulp), as eager's Welford mean is; a plain sum / N is an ulp off there and a normalized
    constant row came out ulp * rstd instead of 0 (3e-5 at eps 1e-3). d - sum(d) / N rather than
    x - mean: a row held in registers keeps d from the squares' pass (LayerNorm 8192 x 256, AVX-512:
    0.87-0.90x the time of x - mean; AVX2 0.98x)."""
    x = em.cast(x, acc_dtype(em.ttype(x).dtype))
    dtype, n = em.ttype(x).dtype, count(em, x, axes)
    first = mean(em, x, axes, True)
    d0 = em.emit(Op.SUB, (x, first))
    s1 = em.emit(Op.SUM, (d0,), axes=axes, keepdim=True)
    s2 = em.emit(Op.SUM, (em.emit(Op.MUL, (d0, d0)),), axes=axes, keepdim=True)
    per = em.emit(Op.DIV, (s1, em.scalar(n, dtype)))
    mu = em.emit(Op.ADD, (first, per))
    sq = em.emit(Op.MAXIMUM, (em.emit(Op.SUB, (s2, em.emit(Op.MUL, (s1, per)))), em.scalar(0.0, dtype)))
    if is_sym(n) and float(correction).is_integer():  # a symbolic count stays symbolic (no guard on N)
        denominator: Any = smax(0, n - int(correction))
    else:
        denominator = max(0.0, n - correction)
    var = em.emit(Op.DIV, (sq, em.scalar(denominator, dtype)))
    kept = tuple(s for i, s in enumerate(em.ttype(var).shape) if keepdim or i not in axes)
    if len(kept) != em.ttype(var).rank:
        var = em.emit(Op.RESHAPE, (var,), shape=kept)
    return Moments(var, mu, em.emit(Op.SUB, (d0, per)))


@lowers(aten.sum.dim_IntList, aten.sum.default)
def lower_sum(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.cast(em.value(a["self"]), em.out_dtype())
    return reduce(em, Op.SUM, x, axes_of(em, x, a.get("dim")), bool(a.get("keepdim")))


@lowers(aten.prod.dim_int, aten.prod.default)
def lower_prod(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.cast(em.value(a["self"]), em.out_dtype())
    return reduce(em, Op.PROD, x, axes_of(em, x, a.get("dim")), bool(a.get("keepdim")))


@lowers(aten.mean.dim, aten.mean.default)
def lower_mean(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.cast(em.value(a["self"]), em.out_dtype())
    return em.cast(mean(em, x, axes_of(em, x, a.get("dim")), bool(a.get("keepdim"))), em.out_dtype())


@lowers(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def lower_amax(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.value(a["self"])
    op = Op.AMAX if node.target.overloadpacket in (aten.amax, aten.max) else Op.AMIN  # type: ignore[union-attr]
    return reduce(em, op, x, axes_of(em, x, a.get("dim")), bool(a.get("keepdim")))


@lowers(aten.max.dim, aten.min.dim)
def lower_max_dim(em: Emitter, node: torch.fx.Node) -> tuple[str, str]:
    a = bind(node)
    x = em.value(a["self"])
    axes = normalize_dims((a["dim"],), em.ttype(x).rank)  # () for a 0-d tensor
    is_max = node.target.overloadpacket is aten.max  # type: ignore[union-attr]
    values = reduce(em, Op.AMAX if is_max else Op.AMIN, x, axes, a["keepdim"])
    indices = em.emit(Op.ARGMAX if is_max else Op.ARGMIN, (x,), axes=axes, keepdim=a["keepdim"])
    return values, indices


@lowers(aten.argmax.default, aten.argmin.default)
def lower_argmax(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.value(a["self"])
    rank = em.ttype(x).rank
    axes = tuple(range(rank)) if a["dim"] is None else normalize_dims((a["dim"],), rank)  # dim=None: all
    if count(em, x, axes) == 0:
        raise Fallback("argmax over an empty dim")
    op = Op.ARGMAX if node.target.overloadpacket is aten.argmax else Op.ARGMIN  # type: ignore[union-attr]
    return em.emit(op, (x,), axes=axes, keepdim=a["keepdim"])


@lowers(aten.any, aten.all)
def lower_any_all(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.cast(em.value(a["self"]), DType.BOOL)
    op = Op.ANY if node.target.overloadpacket is aten.any else Op.ALL  # type: ignore[union-attr]
    out = reduce(em, op, x, axes_of(em, x, a.get("dim")), bool(a.get("keepdim")))
    return em.cast(out, em.out_dtype())  # torch keeps uint8 for a uint8 input, bool otherwise


def _correction(a: dict[str, Any]) -> float:
    """torch's correction: the explicit one, else unbiased (default True) -> 1, biased -> 0."""
    if a.get("correction") is not None:
        return float(a["correction"])
    return 1.0 if a.get("unbiased", True) is not False else 0.0


def _var_std(em: Emitter, node: torch.fx.Node) -> tuple[str, str, bool]:
    """(var, mean) of the node's input in its result dtype; bool: whether the op is a std."""
    a = bind(node)
    x = em.value(a["self"])
    var, mu, _ = variance(em, x, axes_of(em, x, a.get("dim")), _correction(a), bool(a.get("keepdim")))
    is_std = node.target.overloadpacket in (aten.std, aten.std_mean)  # type: ignore[union-attr]
    return var, mu, is_std


@lowers(aten.var, aten.std)
def lower_var(em: Emitter, node: torch.fx.Node) -> str:
    var, _, is_std = _var_std(em, node)
    return em.cast(em.emit(Op.SQRT, (var,)) if is_std else var, em.out_dtype())


@lowers(aten.var_mean, aten.std_mean)
def lower_var_mean(em: Emitter, node: torch.fx.Node) -> tuple[str, str]:
    var, mu, is_std = _var_std(em, node)
    spread = em.emit(Op.SQRT, (var,)) if is_std else var
    mu = em.emit(Op.RESHAPE, (mu,), shape=em.ttype(var).shape) if em.ttype(mu).shape != em.ttype(var).shape else mu
    return em.cast(spread, em.out_dtype(0)), em.cast(mu, em.out_dtype(1))


@lowers(aten.logsumexp.default)
def lower_logsumexp(em: Emitter, node: torch.fx.Node) -> str:
    """m + log(sum(exp(x - m))) with m = max (0 where infinite, so all -inf rows give -inf)."""
    a = bind(node)
    x = em.cast(em.value(a["self"]), em.out_dtype())
    axes, keepdim = axes_of(em, x, a["dim"]), a["keepdim"]
    dtype = em.ttype(x).dtype
    m = reduce(em, Op.AMAX, x, axes, True)
    m = em.emit(Op.WHERE, (em.emit(Op.ISINF, (m,)), em.scalar(0, dtype), m))
    e = em.emit(Op.EXP, (em.emit(Op.SUB, (x, m)),))
    out = em.emit(Op.ADD, (em.emit(Op.LOG, (em.emit(Op.SUM, (e,), axes=axes, keepdim=True),)), m))
    return out if keepdim else em.emit(Op.RESHAPE, (out,), shape=em.out_type().shape)
