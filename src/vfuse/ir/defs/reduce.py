"""Reductions over an explicit, sorted tuple of axes (`axes=()` reduces nothing).

The frontend resolves torch's "None means all dims"; mean, var and std are decomposed into
SUM and pointwise ops so that the planner can fuse them into single-pass row kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vfuse.ir import shapes
from vfuse.ir.defs import rules
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type


def _reduce_infer(out_dtype: DType | None) -> Callable:
    def infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
        (x,) = ins
        axes = attrs["axes"]
        if tuple(sorted(set(axes))) != tuple(axes) or any(not 0 <= a < x.rank for a in axes):
            raise rules.TypeRuleError(f"axes {axes} must be sorted, unique dims of {x}")
        return TensorType(shapes.reduce(x.shape, axes, attrs["keepdim"]), out_dtype or x.dtype)

    return infer


def _over_axes(fn: Callable) -> Callable:
    """Apply a torch reduction that takes one dim at a time over several axes."""

    def ref(x: torch.Tensor, attrs: Attrs) -> torch.Tensor:
        axes, keepdim = attrs["axes"], attrs["keepdim"]
        for a in sorted(axes, reverse=True):
            x = fn(x, a, keepdim)
        return x.clone() if not axes else x

    return ref


def _sum(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.sum(x, dim=dim, keepdim=keepdim, dtype=x.dtype)


def _prod(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.prod(x, dim=dim, keepdim=keepdim, dtype=x.dtype)


def _amax(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.amax(x, dim=dim, keepdim=keepdim)


def _amin(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.amin(x, dim=dim, keepdim=keepdim)


def _any(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.any(x, dim=dim, keepdim=keepdim)


def _all(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return torch.all(x, dim=dim, keepdim=keepdim)


for _op, _fn, _dt in [
    (Op.SUM, _sum, None),
    (Op.PROD, _prod, None),
    (Op.AMAX, _amax, None),
    (Op.AMIN, _amin, None),
    (Op.ANY, _any, DType.BOOL),
    (Op.ALL, _all, DType.BOOL),
]:
    register(
        OpDef(
            _op,
            Kind.REDUCE,
            1,
            _reduce_infer(_dt),
            _over_axes(_fn),
            rules.per_input_element(1),
            attrs=("axes", "keepdim"),
        )
    )


def _arg_ref(fn: Callable) -> Callable:
    """The position of the winner among the reduced axes' elements, in row-major order."""

    def ref(x: torch.Tensor, attrs: Attrs) -> torch.Tensor:
        axes, keepdim = attrs["axes"], attrs["keepdim"]
        x = x.to(torch.uint8) if x.dtype == torch.bool else x  # torch.max of bools has indices, argmax none
        if len(axes) == 1:
            return fn(x, dim=axes[0], keepdim=keepdim)
        kept = x.dim() - len(axes)
        flat = x.movedim(axes, tuple(range(kept, x.dim()))).flatten(kept) if axes else x.unsqueeze(-1)
        return fn(flat, dim=-1).reshape(shapes.reduce(tuple(x.shape), axes, keepdim))

    return ref


for _op, _fn in [(Op.ARGMAX, torch.argmax), (Op.ARGMIN, torch.argmin)]:
    register(
        OpDef(
            _op,
            Kind.REDUCE,
            1,
            _reduce_infer(DType.I64),
            _arg_ref(_fn),
            rules.per_input_element(2),
            attrs=("axes", "keepdim"),
            doc="the index inside the reduced axes (all of them: torch's dim=None); ties pick the first like torch",
            returns_index=True,
        )
    )
