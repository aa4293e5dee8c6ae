"""Source lowerings: constant fills (full, zeros, ones, empty, *_like, scalar_tensor, fill),
arange (IOTA) and triu/tril (a mask built from two IOTAs).

Shapes and dtypes come from meta['val'], which already applies torch's defaults. `empty`
becomes zeros: any content is a valid result for uninitialized memory.
"""

from __future__ import annotations

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind, python_scalar
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import reshape
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op

aten = torch.ops.aten


def full(em: Emitter, value: object, shape: tuple[int, ...], dtype: DType) -> str:
    return em.emit(Op.FULL, value=python_scalar(value, dtype), shape=shape, dtype=dtype)


@lowers(aten.full.default, aten.full_like.default, aten.new_full.default, aten.scalar_tensor.default)
def lower_full(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    value = a["fill_value"] if "fill_value" in a else a["s"]
    out = em.out_type()
    return full(em, value, out.shape, out.dtype)


@lowers(
    aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
    aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default,
    aten.zero.default,
)  # fmt: skip
def lower_zeros(em: Emitter, node: torch.fx.Node) -> str:
    out = em.out_type()
    return full(em, 0, out.shape, out.dtype)


@lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def lower_ones(em: Emitter, node: torch.fx.Node) -> str:
    out = em.out_type()
    return full(em, 1, out.shape, out.dtype)


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def lower_fill(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    out = em.out_type()
    if not isinstance(a["value"], torch.fx.Node):
        return full(em, a["value"], out.shape, out.dtype)
    value = em.cast(em.value(a["value"]), out.dtype)
    return em.emit(Op.EXPAND, (reshape(em, value, (1,) * out.rank),), shape=out.shape)


@lowers(aten.arange.start_step, aten.arange.start, aten.arange.default)
def lower_arange(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    out = em.out_type()
    start = a["start"] if "start" in a else 0
    step = a.get("step", 1)
    if not out.dtype.is_float and not (float(start).is_integer() and float(step).is_integer()):
        raise Fallback("integer arange with fractional start or step")
    cast = float if out.dtype.is_float else int
    return em.emit(Op.IOTA, length=out.shape[0], start=cast(start), step=cast(step), dtype=out.dtype)


@lowers(aten.triu.default, aten.tril.default)
def lower_tri(em: Emitter, node: torch.fx.Node) -> str:
    """Keep x[..., i, j] where j - i >= diagonal (triu) or <= diagonal (tril), else 0."""
    a = bind(node)
    x = em.value(a["self"])
    rows, cols = em.ttype(x).shape[-2:]
    i = reshape(em, em.emit(Op.IOTA, length=rows, start=0, step=1, dtype=DType.I64), (rows, 1))
    j = reshape(em, em.emit(Op.IOTA, length=cols, start=0, step=1, dtype=DType.I64), (1, cols))
    offset = em.emit(Op.SUB, (j, i))
    cmp = Op.GE if node.target.overloadpacket is aten.triu else Op.LE  # type: ignore[union-attr]
    keep = em.emit(cmp, (offset, em.scalar(a["diagonal"], DType.I64)))
    dtype = em.ttype(x).dtype
    return em.emit(Op.WHERE, (keep, x, em.scalar(0, dtype)))
