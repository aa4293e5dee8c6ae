"""Ops whose forward and backward ran through torch: nll_loss (cross-entropy's second half).
(Pooling: lower_pool.py; embedding backward: lower_gather.py.)

Both halves are written with a one-hot mask (class index == target, target != ignore_index) instead of a
gather and a scatter, so the forward is a row reduction that fuses behind log_softmax and the
backward a pointwise kernel that fuses into log_softmax's backward. Picking x[i, target[i]] as
a sum of the row where everything else is 0 is exact; the batch's sum may add in another order
than eager's (within the usual reduction tolerance). Class weights run through torch.
"""

from __future__ import annotations

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import reshape
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2  # torch's reduction enum


def _mask(em: Emitter, x: str, target: str, ignore: int) -> tuple[str, str]:
    """(one-hot bool mask of x's shape, per-row bool 'counted') for (N, C) or (C,) inputs."""
    shape = em.ttype(x).shape
    classes = shape[-1]
    iota = em.emit(Op.IOTA, length=classes, start=0, step=1, dtype=DType.I64)
    t = em.cast(target, DType.I64)
    t_col = reshape(em, t, (*em.ttype(t).shape, 1))
    counted = em.emit(Op.NE, (t, em.scalar(ignore, DType.I64)))
    hit = em.emit(Op.EQ, (reshape(em, iota, (1,) * (len(shape) - 1) + (classes,)), t_col))
    return em.emit(Op.LOGICAL_AND, (hit, reshape(em, counted, (*em.ttype(counted).shape, 1)))), counted


def _check(a: dict, x: str, em: Emitter) -> None:
    if a["weight"] is not None:
        raise Fallback("nll_loss with class weights")
    if len(em.ttype(x).shape) not in (1, 2) or not em.ttype(x).dtype.is_float:
        raise Fallback("nll_loss of other than (N, C) or (C,) float input")


@lowers(aten.nll_loss_forward.default)
def lower_nll_loss_forward(em: Emitter, node: torch.fx.Node) -> tuple[str, str]:
    a = bind(node)
    x = em.value(a["self"])
    _check(a, x, em)
    dtype = em.ttype(x).dtype
    mask, counted = _mask(em, x, em.value(a["target"]), a["ignore_index"])
    zero = em.scalar(0, dtype)
    picked = em.emit(Op.SUM, (em.emit(Op.WHERE, (mask, x, zero)),), axes=(len(em.ttype(x).shape) - 1,), keepdim=False)
    loss = em.emit(Op.NEG, (picked,))
    count = em.cast(counted, dtype)
    if em.ttype(count).shape:
        count = em.emit(Op.SUM, (count,), axes=(0,), keepdim=False)
    if a["reduction"] == NONE:
        return loss, count
    total = em.emit(Op.SUM, (loss,), axes=(0,), keepdim=False) if em.ttype(loss).shape else loss
    return (em.emit(Op.DIV, (total, count)) if a["reduction"] == MEAN else total), count


@lowers(aten.nll_loss_backward.default)
def lower_nll_loss_backward(em: Emitter, node: torch.fx.Node) -> str:
    """grad[i, c] = -g_i (sum, none) or -(g / total_weight) (mean) where c == target[i], else 0."""
    a = bind(node)
    x = em.value(a["self"])
    _check(a, x, em)
    dtype = em.ttype(x).dtype
    mask, _ = _mask(em, x, em.value(a["target"]), a["ignore_index"])
    g = em.cast(em.value(a["grad_output"]), dtype)
    if a["reduction"] == MEAN:
        g = em.emit(Op.DIV, (g, em.cast(em.value(a["total_weight"]), dtype)))
    if em.ttype(g).shape:  # reduction none: one gradient per row
        g = reshape(em, g, (*em.ttype(g).shape, 1))
    return em.emit(Op.WHERE, (mask, em.emit(Op.NEG, (g,)), em.scalar(0, dtype)))
