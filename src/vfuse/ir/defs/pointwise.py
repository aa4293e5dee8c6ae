"""Pointwise ops: unary math, casts, binary arithmetic/comparison/logic, where, dropout.

Binary ops broadcast their inputs implicitly and require one shared dtype: the frontend
inserts explicit CASTs for torch's type promotion, so code generators never promote.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vfuse.errors import VfuseZeroDivisionError
from vfuse.ir import shapes
from vfuse.ir.defs import rules
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type

EW = Kind.ELEMENTWISE


def _unary(op: Op, fn: Callable, flops: int = 1, infer: Callable = rules.float_unary) -> None:
    register(OpDef(op, EW, 1, infer, lambda x, attrs: fn(x), rules.per_element(flops)))


# Float math; flop weights approximate instruction counts of a vectorized implementation.
for _op, _fn, _fl in [
    (Op.EXP, torch.exp, 8),
    (Op.EXP2, torch.exp2, 8),
    (Op.EXPM1, torch.expm1, 10),
    (Op.LOG, torch.log, 8),
    (Op.LOG2, torch.log2, 8),
    (Op.LOG10, torch.log10, 8),
    (Op.LOG1P, torch.log1p, 10),
    (Op.SQRT, torch.sqrt, 4),
    (Op.RSQRT, torch.rsqrt, 4),
    (Op.SIN, torch.sin, 10),
    (Op.COS, torch.cos, 10),
    (Op.TAN, torch.tan, 12),
    (Op.ASIN, torch.asin, 12),
    (Op.ACOS, torch.acos, 12),
    (Op.ATAN, torch.atan, 12),
    (Op.SINH, torch.sinh, 12),
    (Op.COSH, torch.cosh, 12),
    (Op.TANH, torch.tanh, 10),
    (Op.ASINH, torch.asinh, 14),
    (Op.ACOSH, torch.acosh, 14),
    (Op.ATANH, torch.atanh, 14),
    (Op.ERF, torch.erf, 12),
    (Op.ERFC, torch.erfc, 12),
    (Op.SIGMOID, torch.sigmoid, 10),
    (Op.SILU, F.silu, 11),
    (Op.RECIPROCAL, torch.reciprocal, 1),
    (Op.FLOOR, torch.floor, 1),
    (Op.CEIL, torch.ceil, 1),
    (Op.ROUND, torch.round, 1),
    (Op.TRUNC, torch.trunc, 1),
]:
    _unary(_op, _fn, _fl)

# Defined for every numeric dtype.
for _op, _fn in [(Op.NEG, torch.neg), (Op.ABS, torch.abs), (Op.RELU, torch.relu), (Op.SIGN, torch.sign)]:
    _unary(_op, _fn, 1, rules.same_as_input)

_unary(Op.BITWISE_NOT, torch.bitwise_not, 1, rules.int_unary)
_unary(Op.LOGICAL_NOT, torch.logical_not, 1, rules.to_bool)
_unary(Op.ISNAN, torch.isnan, 1, rules.to_bool)
_unary(Op.ISINF, torch.isinf, 1, rules.to_bool)

register(
    OpDef(
        Op.GELU,
        EW,
        1,
        rules.float_unary,
        lambda x, attrs: F.gelu(x, approximate=attrs["approximate"]),
        rules.per_element(14),
        attrs=("approximate",),
        doc="approximate is 'none' (erf) or 'tanh'; kept whole because it is cheap and fuses anywhere",
    )
)


def _cast_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return TensorType(ins[0].shape, attrs["dtype"])


register(
    OpDef(
        Op.CAST,
        EW,
        1,
        _cast_infer,
        lambda x, attrs: x.to(attrs["dtype"].torch),
        rules.per_element(1),
        attrs=("dtype",),
        doc="float->int truncates toward zero like torch; bool is x != 0",
    )
)


def _binary(op: Op, fn: Callable, infer: Callable, flops: int = 1) -> None:
    register(OpDef(op, Kind.ELEMENTWISE, 2, infer, lambda a, b, attrs: fn(a, b), rules.per_element(flops)))


for _op, _fn in [(Op.ADD, torch.add), (Op.SUB, torch.sub), (Op.MUL, torch.mul)]:
    _binary(_op, _fn, rules.broadcast_binary)
for _op, _fn in [(Op.MAXIMUM, torch.maximum), (Op.MINIMUM, torch.minimum)]:
    _binary(_op, _fn, rules.broadcast_binary)
_binary(Op.DIV, torch.div, rules.broadcast_float_binary, 2)
_binary(Op.POW, torch.pow, rules.broadcast_binary, 16)
_binary(Op.ATAN2, torch.atan2, rules.broadcast_float_binary, 16)


def _int_division(fn: Callable) -> Callable:
    """`fn` raising VfuseZeroDivisionError for an integer divisor of 0, as the kernels do (torch
    raises a RuntimeError saying 'ZeroDivisionError'); float division by 0 gives inf/nan."""

    def ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        empty = shapes.numel(shapes.broadcast(tuple(a.shape), tuple(b.shape))) == 0
        if not b.dtype.is_floating_point and not empty and not bool(b.all()):
            raise integer_division_by_zero()
        return fn(a, b)

    return ref


def integer_division_by_zero() -> VfuseZeroDivisionError:
    return VfuseZeroDivisionError("integer division by zero (ZeroDivisionError)")


# Integer division by zero raises; the kernels wrap INT_MIN // -1 (== INT_MIN) like torch.
INT_DIVISION = (Op.FLOOR_DIV, Op.REMAINDER, Op.FMOD)
_binary(Op.FLOOR_DIV, _int_division(lambda a, b: torch.div(a, b, rounding_mode="floor")), rules.broadcast_binary, 2)
_binary(Op.REMAINDER, _int_division(torch.remainder), rules.broadcast_binary, 3)
_binary(Op.FMOD, _int_division(torch.fmod), rules.broadcast_binary, 3)
for _op, _fn in [
    (Op.BITWISE_AND, torch.bitwise_and),
    (Op.BITWISE_OR, torch.bitwise_or),
    (Op.BITWISE_XOR, torch.bitwise_xor),
]:
    _binary(_op, _fn, rules.broadcast_int_binary)
for _op, _fn in [
    (Op.LOGICAL_AND, torch.logical_and),
    (Op.LOGICAL_OR, torch.logical_or),
    (Op.LOGICAL_XOR, torch.logical_xor),
]:
    _binary(_op, _fn, rules.broadcast_to_bool)
for _op, _fn in [
    (Op.EQ, torch.eq),
    (Op.NE, torch.ne),
    (Op.LT, torch.lt),
    (Op.LE, torch.le),
    (Op.GT, torch.gt),
    (Op.GE, torch.ge),
]:
    _binary(_op, _fn, rules.compare)


def _where_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    cond, a, b = ins
    if cond.dtype is not DType.BOOL:
        raise rules.TypeRuleError(f"where condition must be bool, got {cond}")
    dtype = rules.broadcast_binary((a, b), attrs).dtype
    return TensorType(shapes.broadcast(cond.shape, a.shape, b.shape), dtype)


register(OpDef(Op.WHERE, EW, 3, _where_infer, lambda c, a, b, attrs: torch.where(c, a, b), rules.per_element(1)))
