"""Pointwise lowerings: unary math, binary arithmetic, comparisons, logic, where, clamps, casts.

Types follow the FX node's meta['val']: arithmetic is computed in the result dtype (operands
are CAST to it), comparisons in torch's promoted dtype of their operands, logical ops on bools.
Python scalars become shape-() FULL nodes; broadcasting is implicit in the IR's binary ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_foreach import fused_multiply_add
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op

aten = torch.ops.aten
prims = torch.ops.prims

UNARY: dict[Any, Op] = {
    aten.exp: Op.EXP, aten.exp2: Op.EXP2, aten.expm1: Op.EXPM1, aten.log: Op.LOG, aten.log2: Op.LOG2,
    aten.log10: Op.LOG10, aten.log1p: Op.LOG1P, aten.sqrt: Op.SQRT, aten.rsqrt: Op.RSQRT, aten.sin: Op.SIN,
    aten.cos: Op.COS, aten.tan: Op.TAN, aten.asin: Op.ASIN, aten.acos: Op.ACOS, aten.atan: Op.ATAN,
    aten.sinh: Op.SINH, aten.cosh: Op.COSH, aten.tanh: Op.TANH, aten.asinh: Op.ASINH, aten.acosh: Op.ACOSH,
    aten.atanh: Op.ATANH, aten.erf: Op.ERF, aten.erfc: Op.ERFC, aten.sigmoid: Op.SIGMOID, aten.relu: Op.RELU,
    aten.silu: Op.SILU, aten.reciprocal: Op.RECIPROCAL, aten.floor: Op.FLOOR, aten.ceil: Op.CEIL,
    aten.trunc: Op.TRUNC, aten.neg: Op.NEG, aten.abs: Op.ABS, aten.sign: Op.SIGN, aten.sgn: Op.SIGN,
    aten.bitwise_not: Op.BITWISE_NOT, aten.fix: Op.TRUNC,
}  # fmt: skip
ROUNDING = (Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC)
TO_BOOL: dict[Any, Op] = {aten.isnan: Op.ISNAN, aten.isinf: Op.ISINF, aten.logical_not: Op.LOGICAL_NOT}
ARITH: dict[Any, Op] = {
    aten.mul: Op.MUL, aten.floor_divide: Op.FLOOR_DIV, aten.remainder: Op.REMAINDER, aten.fmod: Op.FMOD,
    aten.pow: Op.POW, aten.maximum: Op.MAXIMUM, aten.minimum: Op.MINIMUM, aten.atan2: Op.ATAN2,
    aten.bitwise_and: Op.BITWISE_AND, aten.bitwise_or: Op.BITWISE_OR, aten.bitwise_xor: Op.BITWISE_XOR,
    aten.__and__: Op.BITWISE_AND, aten.__or__: Op.BITWISE_OR, aten.__xor__: Op.BITWISE_XOR,
}  # fmt: skip
COMPARE: dict[Any, Op] = {
    aten.eq: Op.EQ,
    aten.ne: Op.NE,
    aten.lt: Op.LT,
    aten.le: Op.LE,
    aten.gt: Op.GT,
    aten.ge: Op.GE,
}
LOGICAL: dict[Any, Op] = {
    aten.logical_and: Op.LOGICAL_AND,
    aten.logical_or: Op.LOGICAL_OR,
    aten.logical_xor: Op.LOGICAL_XOR,
}


def operands(node: torch.fx.Node) -> list[Any]:
    """The op's leading arguments in schema order (binary ops: the two operands)."""
    return list(bind(node).values())


def promoted(a: Any, b: Any) -> DType:
    """torch's result dtype of `a op b` (tensors by dtype and rank-0-ness, python scalars as such)."""

    def meta(x: Any) -> Any:
        if not isinstance(x, torch.fx.Node):
            return x
        v = x.meta["val"]
        return torch.empty((1,) if v.dim() else (), dtype=v.dtype, device="meta")

    ma, mb = meta(a), meta(b)
    if not isinstance(ma, torch.Tensor) and not isinstance(mb, torch.Tensor):
        ma = torch.tensor(ma, device="meta")
    return DType.from_torch(torch.result_type(ma, mb) if isinstance(ma, torch.Tensor) else torch.result_type(mb, ma))


@lowers(*UNARY)
def lower_unary(em: Emitter, node: torch.fx.Node) -> str:
    op, dtype = UNARY[node.target.overloadpacket], em.out_dtype()  # type: ignore[union-attr]
    x = em.cast(em.value(node.args[0]), dtype)
    if op in ROUNDING and not dtype.is_float:
        return x  # torch rounds integers to themselves
    return em.emit(op, (x,))


@lowers(aten.round.default)
def lower_round(em: Emitter, node: torch.fx.Node) -> str:
    x = em.cast(em.value(node.args[0]), em.out_dtype())
    return em.emit(Op.ROUND, (x,)) if em.out_dtype().is_float else x


@lowers(*TO_BOOL)
def lower_to_bool(em: Emitter, node: torch.fx.Node) -> str:
    return em.emit(TO_BOOL[node.target.overloadpacket], (em.value(node.args[0]),))  # type: ignore[union-attr]


@lowers(aten.isfinite)
def lower_isfinite(em: Emitter, node: torch.fx.Node) -> str:
    x = em.value(node.args[0])
    bad = em.emit(Op.LOGICAL_OR, (em.emit(Op.ISNAN, (x,)), em.emit(Op.ISINF, (x,))))
    return em.emit(Op.LOGICAL_NOT, (bad,))


@lowers(aten.gelu)
def lower_gelu(em: Emitter, node: torch.fx.Node) -> str:
    x = em.cast(em.value(node.args[0]), em.out_dtype())
    return em.emit(Op.GELU, (x,), approximate=bind(node)["approximate"])


def opmath(dtype: DType, *args: Any) -> DType:
    """The dtype eager computes fp16/bf16 `mul` and true `div` with a python scalar in: fp32, the
    scalar unrounded, the result rounded once (the IR computes in fp32 and casts). Other ops
    (add, sub, pow, ...) round the scalar to the tensor's dtype first, as `scalar()` does."""
    low = dtype in (DType.F16, DType.BF16)
    return DType.F32 if low and any(not isinstance(a, torch.fx.Node) for a in args) else dtype


@lowers(*ARITH)
def lower_arith(em: Emitter, node: torch.fx.Node) -> str:
    a, b = operands(node)[:2]
    dtype = em.out_dtype()
    op = ARITH[node.target.overloadpacket]  # type: ignore[union-attr]
    calc = opmath(dtype, a, b) if op is Op.MUL else dtype
    return em.cast(em.emit(op, (em.operand(a, calc), em.operand(b, calc))), dtype)


@lowers(aten.add, aten.sub, aten.rsub)
def lower_add_sub(em: Emitter, node: torch.fx.Node) -> str:
    """a + alpha * b (sub: a - alpha * b; rsub: b - alpha * a)."""
    args = bind(node)
    a, b = operands(node)[:2]
    if node.target.overloadpacket is aten.rsub:  # type: ignore[union-attr]
        a, b = b, a
    dtype = em.out_dtype()
    y = em.operand(b, dtype)
    add = node.target.overloadpacket is aten.add  # type: ignore[union-attr]
    if args["alpha"] != 1 and dtype.is_float:
        # Eager's kernel is fma(b, alpha, a), alpha in the tensor's dtype: one rounding.
        alpha = em.scalar(args["alpha"] if add else -args["alpha"], dtype)
        return fused_multiply_add(em, y, alpha, em.operand(a, dtype), dtype)
    if args["alpha"] != 1:
        y = em.emit(Op.MUL, (y, em.scalar(args["alpha"], dtype)))
    op = Op.ADD if add else Op.SUB
    return em.emit(op, (em.operand(a, dtype), y))


@lowers(aten.div, aten.true_divide)
def lower_div(em: Emitter, node: torch.fx.Node) -> str:
    args = bind(node)
    a, b = operands(node)[:2]
    dtype, mode = em.out_dtype(), args.get("rounding_mode")
    if mode is None:
        calc = opmath(dtype, a, b)
        return em.cast(em.emit(Op.DIV, (em.operand(a, calc), em.operand(b, calc))), dtype)
    x, y = em.operand(a, dtype), em.operand(b, dtype)
    if mode == "floor":
        return em.emit(Op.FLOOR_DIV, (x, y))
    if dtype.is_float:
        return em.emit(Op.TRUNC, (em.emit(Op.DIV, (x, y)),))
    # Integer truncating division: x - fmod(x, y) is an exact multiple of y, so flooring is exact.
    return em.emit(Op.FLOOR_DIV, (em.emit(Op.SUB, (x, em.emit(Op.FMOD, (x, y)))), y))


@lowers(*COMPARE)
def lower_compare(em: Emitter, node: torch.fx.Node) -> str:
    a, b = operands(node)[:2]
    dtype = promoted(a, b)
    return em.emit(COMPARE[node.target.overloadpacket], (em.operand(a, dtype), em.operand(b, dtype)))  # type: ignore[union-attr]


@lowers(*LOGICAL)
def lower_logical(em: Emitter, node: torch.fx.Node) -> str:
    a, b = operands(node)[:2]
    op = LOGICAL[node.target.overloadpacket]  # type: ignore[union-attr]
    return em.emit(op, (em.operand(a, DType.BOOL), em.operand(b, DType.BOOL)))


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def lower_where(em: Emitter, node: torch.fx.Node) -> str:
    cond, a, b = operands(node)[:3]
    dtype = em.out_dtype()
    return em.emit(Op.WHERE, (em.operand(cond, DType.BOOL), em.operand(a, dtype), em.operand(b, dtype)))


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def lower_masked_fill(em: Emitter, node: torch.fx.Node) -> str:
    x, mask, value = operands(node)[:3]
    dtype = em.out_dtype()
    return em.emit(Op.WHERE, (em.operand(mask, DType.BOOL), em.operand(value, dtype), em.operand(x, dtype)))


def clamp(em: Emitter, x: Any, lo: Any, hi: Any) -> str:
    """min(max(x, lo), hi) in the result dtype; a None bound is absent (torch's clamp)."""
    dtype = em.out_dtype()
    y = em.operand(x, dtype)
    if lo is not None:
        y = em.emit(Op.MAXIMUM, (y, em.operand(lo, dtype)))
    if hi is not None:
        y = em.emit(Op.MINIMUM, (y, em.operand(hi, dtype)))
    return y


@lowers(aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clip.Tensor)
def lower_clamp(em: Emitter, node: torch.fx.Node) -> str:
    x, lo, hi = operands(node)[:3]
    return clamp(em, x, lo, hi)


@lowers(aten.clamp_min)
def lower_clamp_min(em: Emitter, node: torch.fx.Node) -> str:
    x, lo = operands(node)[:2]
    return clamp(em, x, lo, None)


@lowers(aten.clamp_max)
def lower_clamp_max(em: Emitter, node: torch.fx.Node) -> str:
    x, hi = operands(node)[:2]
    return clamp(em, x, None, hi)


@lowers(aten.hardtanh.default)
def lower_hardtanh(em: Emitter, node: torch.fx.Node) -> str:
    x, lo, hi = operands(node)[:3]
    return clamp(em, x, lo, hi)


@lowers(aten.leaky_relu.default)
def lower_leaky_relu(em: Emitter, node: torch.fx.Node) -> str:
    x_arg, slope = operands(node)[:2]
    dtype = em.out_dtype()
    x = em.operand(x_arg, dtype)
    positive = em.emit(Op.GT, (x, em.scalar(0, dtype)))
    return em.emit(Op.WHERE, (positive, x, em.emit(Op.MUL, (x, em.scalar(slope, dtype)))))


@lowers(aten.threshold.default)
def lower_threshold(em: Emitter, node: torch.fx.Node) -> str:
    """x <= threshold ? value : x (torch's definition, so NaN passes through)."""
    x_arg, threshold, value = operands(node)[:3]
    dtype = em.out_dtype()
    x = em.operand(x_arg, dtype)
    below = em.emit(Op.LE, (x, em.scalar(threshold, dtype)))
    return em.emit(Op.WHERE, (below, em.scalar(value, dtype), x))


@lowers(aten._to_copy.default, prims.convert_element_type.default, aten.to)
def lower_cast(em: Emitter, node: torch.fx.Node) -> str:
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        raise Fallback("cast of a non-tensor")
    if src.meta["val"].device != em.out_val().device:
        raise Fallback("device transfer")  # the runtime, not a kernel, moves data between devices
    return em.cast(em.value(src), em.out_dtype())
