"""Neural-network lowerings: softmax / log_softmax, layer_norm, rms_norm, batch_norm
(eval and train, with the updated running statistics). Pooling: lower_pool.py.

All are decomposed into reductions and pointwise ops here rather than by torch, so that
their saved statistics (mean, rstd) are the exact values the normalization used and the
planner sees the row-kernel structure. Half types are computed in fp32 and cast back.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import reshape
from vfuse.frontend.lower_reduce import acc_dtype, count, mean, variance
from vfuse.frontend.lower_source import full
from vfuse.frontend.registry import lowers
from vfuse.frontend.symbols import size_ratio
from vfuse.ir import Op
from vfuse.ir.shapes import normalize_dims

aten = torch.ops.aten


def _softmax(em: Emitter, node: torch.fx.Node, log: bool) -> str:
    a = bind(node)
    out = em.out_type()
    if out.numel == 0:
        return full(em, 0, out.shape, out.dtype)
    x = em.cast(em.value(a["self"]), out.dtype)  # softmax.int's dtype argument casts the input first
    x = em.cast(x, acc_dtype(out.dtype))
    axes = normalize_dims((a["dim"],), em.ttype(x).rank)
    shifted = em.emit(Op.SUB, (x, em.emit(Op.AMAX, (x,), axes=axes, keepdim=True)))
    e = em.emit(Op.EXP, (shifted,))
    z = em.emit(Op.SUM, (e,), axes=axes, keepdim=True)
    y = em.emit(Op.SUB, (shifted, em.emit(Op.LOG, (z,)))) if log else em.emit(Op.DIV, (e, z))
    return em.cast(y, out.dtype)


@lowers(aten._softmax.default, aten.softmax.int)
def lower_softmax(em: Emitter, node: torch.fx.Node) -> str:
    return _softmax(em, node, log=False)


@lowers(aten._log_softmax.default, aten.log_softmax.int)
def lower_log_softmax(em: Emitter, node: torch.fx.Node) -> str:
    return _softmax(em, node, log=True)


def _affine(em: Emitter, y: str, weight: Any, bias: Any, shape: tuple[int, ...] | None = None) -> str:
    """y * weight + bias (either may be None), the parameters reshaped to `shape` if given."""
    dtype = em.ttype(y).dtype
    for arg, op in ((weight, Op.MUL), (bias, Op.ADD)):
        if arg is not None:
            p = em.cast(em.value(arg), dtype)
            y = em.emit(op, (y, reshape(em, p, shape) if shape else p))
    return y


@lowers(aten.native_layer_norm.default)
def lower_layer_norm(em: Emitter, node: torch.fx.Node) -> tuple[str, str, str]:
    a = bind(node)
    x = em.value(a["input"])
    x = em.cast(x, acc_dtype(em.ttype(x).dtype))
    rank = em.ttype(x).rank
    axes = tuple(range(rank - len(a["normalized_shape"]), rank))
    var, mu, centered = variance(em, x, axes, 0.0, keepdim=True)
    rstd = em.emit(Op.RSQRT, (em.emit(Op.ADD, (var, em.scalar(a["eps"], em.ttype(var).dtype))),))
    y = _affine(em, em.emit(Op.MUL, (centered, rstd)), a["weight"], a["bias"])
    stats = [reshape(em, em.cast(v, em.out_dtype(i)), em.out_type(i).shape) for i, v in ((1, mu), (2, rstd))]
    return em.cast(y, em.out_dtype(0)), stats[0], stats[1]


def _rms_norm(em: Emitter, a: dict[str, Any]) -> tuple[str, str]:
    """(y, rstd) with rstd = rsqrt(mean(x^2) + eps) over the normalized dims (kept as size 1)."""
    x = em.value(a["input"])
    t = em.ttype(x)
    x = em.cast(x, acc_dtype(t.dtype))
    axes = tuple(range(t.rank - len(a["normalized_shape"]), t.rank))
    eps = a["eps"] if a["eps"] is not None else torch.finfo(t.dtype.torch).eps
    ms = mean(em, em.emit(Op.MUL, (x, x)), axes, keepdim=True)
    rstd = em.emit(Op.RSQRT, (em.emit(Op.ADD, (ms, em.scalar(eps, em.ttype(ms).dtype))),))
    return _affine(em, em.emit(Op.MUL, (x, rstd)), a["weight"], None), rstd


@lowers(aten.rms_norm.default)
def lower_rms_norm(em: Emitter, node: torch.fx.Node) -> str:
    y, _ = _rms_norm(em, bind(node))
    return em.cast(y, em.out_dtype())


@lowers(aten._fused_rms_norm.default)
def lower_fused_rms_norm(em: Emitter, node: torch.fx.Node) -> tuple[str, str]:
    y, rstd = _rms_norm(em, bind(node))
    return em.cast(y, em.out_dtype(0)), reshape(em, em.cast(rstd, em.out_dtype(1)), em.out_type(1).shape)


def _channel_shape(em: Emitter, x: str) -> tuple[int, ...]:
    """(1, C, 1, ...): how a per-channel vector broadcasts against NC... activations."""
    shape = em.ttype(x).shape
    return (1, shape[1]) + (1,) * (len(shape) - 2)


def _normalize(em: Emitter, centered: str, rstd: str, a: dict[str, Any]) -> str:
    """centered * rstd * weight + bias with per-channel rstd of shape (1, C, 1, ...)."""
    y = em.emit(Op.MUL, (centered, rstd))
    return _affine(em, y, a["weight"], a["bias"], _channel_shape(em, centered))


def _batch_stats(em: Emitter, a: dict[str, Any]) -> tuple[str, str, str, str]:
    """Training mode: (y, mean, rstd, biased var) over every dim but the channel dim 1."""
    x = em.value(a["input"])
    x = em.cast(x, acc_dtype(em.ttype(x).dtype))
    axes = tuple(d for d in range(em.ttype(x).rank) if d != 1)
    var, mu, centered = variance(em, x, axes, 0.0, keepdim=True)
    rstd = em.emit(Op.RSQRT, (em.emit(Op.ADD, (var, em.scalar(a["eps"], em.ttype(var).dtype))),))
    return _normalize(em, centered, rstd, a), mu, rstd, var


def _running_stats(em: Emitter, a: dict[str, Any]) -> str:
    """Eval mode: y normalized by the running statistics."""
    x = em.value(a["input"])
    x = em.cast(x, acc_dtype(em.ttype(x).dtype))
    dtype, shape = em.ttype(x).dtype, _channel_shape(em, x)
    mu = reshape(em, em.cast(em.value(a["running_mean"]), dtype), shape)
    var = reshape(em, em.cast(em.value(a["running_var"]), dtype), shape)
    rstd = em.emit(Op.RSQRT, (em.emit(Op.ADD, (var, em.scalar(a["eps"], dtype))),))
    return _normalize(em, em.emit(Op.SUB, (x, mu)), rstd, a)


def _updated(em: Emitter, running: Any, batch: str, factor: float, momentum: float, index: int) -> str:
    """(1 - momentum) * running + momentum * factor * batch, in the running stat's dtype."""
    r = em.value(running)
    dtype = em.ttype(r).dtype
    b = em.cast(reshape(em, batch, em.ttype(r).shape), dtype)
    b = em.emit(Op.MUL, (b, em.scalar(momentum * factor, dtype)))
    return em.cast(em.emit(Op.ADD, (em.emit(Op.MUL, (r, em.scalar(1 - momentum, dtype))), b)), em.out_dtype(index))


def _stat_out(em: Emitter, node: torch.fx.Node, index: int, value: str | None) -> str | None:
    """A saved-statistics output as meta['val'] shapes it (empty tensors in eval mode)."""
    out = em.out_type(index)
    if out.numel == 0:
        return full(em, 0, out.shape, out.dtype)
    if value is None:
        used = any(u.target is operator.getitem and u.args[1] == index for u in node.users)
        if used:
            raise Fallback(f"output {index} of eval-mode batch norm is not empty")
        return None
    return reshape(em, em.cast(value, out.dtype), out.shape)


def _batch_norm(em: Emitter, node: torch.fx.Node, a: dict[str, Any]) -> tuple[str | None, ...]:
    """Outputs (y, save_mean, save_rstd[, new_running_mean, new_running_var])."""
    five = node.target is aten._native_batch_norm_legit_functional.default
    if a["training"]:
        y, mu, rstd, var = _batch_stats(em, a)
        outs: list[str | None] = [em.cast(y, em.out_dtype(0)), _stat_out(em, node, 1, mu), _stat_out(em, node, 2, rstd)]
        if five:
            n = count(em, em.value(a["input"]), tuple(d for d in range(len(em.out_type(0).shape)) if d != 1))
            unbias = size_ratio(em.symbols, n, n - 1) if n > 1 else math.inf
            m = a["momentum"]
            outs += [_updated(em, a["running_mean"], mu, 1.0, m, 3), _updated(em, a["running_var"], var, unbias, m, 4)]
        return tuple(outs)
    y = em.cast(_running_stats(em, a), em.out_dtype(0))
    outs = [y, _stat_out(em, node, 1, None), _stat_out(em, node, 2, None)]
    if five:
        outs += [em.value(a["running_mean"]), em.value(a["running_var"])]
    return tuple(outs)


@lowers(aten._native_batch_norm_legit_no_training.default)
def lower_batch_norm_eval(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    return _batch_norm(em, node, {**bind(node), "training": False})


@lowers(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.no_stats)
def lower_batch_norm_functional(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    return _batch_norm(em, node, bind(node))


@lowers(aten.native_batch_norm.default)
def lower_native_batch_norm(em: Emitter, node: torch.fx.Node) -> tuple[str | None, ...]:
    a = bind(node)
    if a["training"] and a["running_mean"] is not None:
        # This op updates the running stats in place; torch must run it to keep that effect.
        raise Fallback("native_batch_norm in training mode mutates its running stats")
    if not a["training"] and a["running_mean"] is None:
        raise Fallback("eval-mode batch norm without running stats")
    return _batch_norm(em, node, a)


@lowers(aten._safe_softmax.default)
def lower_safe_softmax(em: Emitter, node: torch.fx.Node) -> str:
    """softmax, but rows that are entirely -inf give 0 instead of NaN (attention's math path)."""
    y = _softmax(em, node, log=False)
    if em.out_type().numel == 0:
        return y
    a = bind(node)
    x = em.value(a["self"])
    axes = normalize_dims((a["dim"],), em.ttype(x).rank)
    masked = em.emit(Op.EQ, (x, em.scalar(-math.inf, em.ttype(x).dtype)))
    dead_rows = em.emit(Op.ALL, (masked,), axes=axes, keepdim=True)
    return em.emit(Op.WHERE, (dead_rows, em.scalar(0, em.ttype(y).dtype), y))
