"""Type rules and flop counters shared by the op definitions (pure functions of types)."""

from __future__ import annotations

from vfuse.ir import shapes
from vfuse.ir.ops import Attrs, FlopsFn
from vfuse.ir.types import DType, TensorType, Type


class TypeRuleError(TypeError):
    """An op was applied to types its rule rejects; the message names them."""


def same_as_input(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return ins[0]


def float_unary(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    if not ins[0].dtype.is_float:
        raise TypeRuleError(f"expects a floating-point input, got {ins[0]}")
    return ins[0]


def int_unary(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    if ins[0].dtype.is_float:
        raise TypeRuleError(f"expects an integer or bool input, got {ins[0]}")
    return ins[0]


def _common_dtype(ins: tuple[TensorType, ...]) -> DType:
    dtypes = {t.dtype for t in ins}
    if len(dtypes) != 1:
        raise TypeRuleError(f"inputs must share one dtype (the frontend casts), got {[str(t) for t in ins]}")
    return dtypes.pop()


def broadcast_binary(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return TensorType(shapes.broadcast(*(t.shape for t in ins)), _common_dtype(ins))


def broadcast_float_binary(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    out = broadcast_binary(ins, attrs)
    if not out.dtype.is_float:
        raise TypeRuleError(f"expects floating-point inputs, got {[str(t) for t in ins]}")
    return out


def broadcast_int_binary(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    out = broadcast_binary(ins, attrs)
    if out.dtype.is_float:
        raise TypeRuleError(f"expects integer or bool inputs, got {[str(t) for t in ins]}")
    return out


def broadcast_to_bool(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return TensorType(shapes.broadcast(*(t.shape for t in ins)), DType.BOOL)


def compare(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    _common_dtype(ins)
    return broadcast_to_bool(ins, attrs)


def to_bool(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return TensorType(ins[0].shape, DType.BOOL)


def per_element(k: int) -> FlopsFn:
    """k flops for every output element (transcendentals count as several)."""

    def flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
        return k * out.numel if isinstance(out, TensorType) else 0

    return flops


def per_input_element(k: int) -> FlopsFn:
    def flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
        return k * ins[0].numel

    return flops


def no_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    return 0


def no_bytes(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    return 0


def output_bytes(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    return out.nbytes
