"""Tensor types of the IR: dtypes as an enum and an immutable (shape, dtype) pair.

IR values are logical tensors: contiguous row-major semantics. Physical strides of the
user's inputs are a runtime concern (the runtime or the code generator reads through
index maps), so they are not part of the type and cannot make two equal graphs differ.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from vfuse.ir import shapes
from vfuse.ir.sym import pretty, same


class DType(enum.Enum):
    """Element types the IR knows. The value is the short name used by the printer."""

    F32 = "f32"
    F64 = "f64"
    F16 = "f16"
    BF16 = "bf16"
    # fp8 (OCP): loaded and widened by kernels, never computed in; rounding to fp8 stays in torch.
    F8E4M3 = "f8e4m3"  # torch.float8_e4m3fn: no infinities, 0x7f / 0xff are NaN
    F8E5M2 = "f8e5m2"  # torch.float8_e5m2: fp16's upper byte
    I8 = "i8"
    U8 = "u8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def itemsize(self) -> int:
        return _TO_TORCH[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2)

    @property
    def is_fp8(self) -> bool:
        return self in (DType.F8E4M3, DType.F8E5M2)

    @property
    def is_int(self) -> bool:
        return self in (DType.I8, DType.U8, DType.I16, DType.I32, DType.I64)

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DType:
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise TypeError(f"vfuse IR has no dtype for torch dtype {dtype}") from None

    @staticmethod
    def supports(dtype: torch.dtype) -> bool:
        return dtype in _FROM_TORCH


_TO_TORCH = {
    DType.F32: torch.float32,
    DType.F64: torch.float64,
    DType.F16: torch.float16,
    DType.BF16: torch.bfloat16,
    DType.F8E4M3: torch.float8_e4m3fn,
    DType.F8E5M2: torch.float8_e5m2,
    DType.I8: torch.int8,
    DType.U8: torch.uint8,
    DType.I16: torch.int16,
    DType.I32: torch.int32,
    DType.I64: torch.int64,
    DType.BOOL: torch.bool,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}


@dataclass(frozen=True, slots=True, eq=False)
class TensorType:
    """The static type of an IR value: shape (ints, or symbolic sizes: ir/sym.py) and element type."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        shapes.check_shape(self.shape)

    def __eq__(self, other: object) -> bool:
        # Symbolic sizes compare structurally (the same expression), taking no guard: types
        # are compared to find identities and to check rules, where "different" is safe.
        return isinstance(other, TensorType) and self.dtype is other.dtype and same(self.shape, other.shape)

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return shapes.numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(pretty(d) for d in self.shape)}]"

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        return TensorType(tuple(int(d) for d in t.shape), DType.from_torch(t.dtype))


@dataclass(frozen=True, slots=True)
class TupleType:
    """Type of an Opaque node whose torch op returns several tensors (read with GET_ITEM)."""

    items: tuple[TensorType, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.items)

    def __str__(self) -> str:
        return "(" + ", ".join(str(t) for t in self.items) + ")"


Type = TensorType | TupleType
