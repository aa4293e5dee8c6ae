"""Layout ops (views, broadcasts, slices, concatenation, gathers).

In a fused kernel these are index maps, not copies; standing alone they copy into a fresh
contiguous buffer, which is what their `bytes` count.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F

from vfuse.errors import VfuseIndexError
from vfuse.ir import shapes
from vfuse.ir.defs import rules
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type


def _reshape_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    shape = attrs["shape"]
    if -1 in shape or shapes.numel(shape) != ins[0].numel:
        raise rules.TypeRuleError(f"cannot reshape {ins[0]} to {shape}")
    return ins[0].with_shape(shape)


register(
    OpDef(
        Op.RESHAPE,
        Kind.INJECTIVE,
        1,
        _reshape_infer,
        lambda x, attrs: x.reshape(attrs["shape"]),
        rules.no_flops,
        attrs=("shape",),
        doc="row-major reshape to a fully resolved shape (no -1)",
        layout_only=True,
    )
)
register(
    OpDef(
        Op.PERMUTE,
        Kind.INJECTIVE,
        1,
        lambda ins, attrs: ins[0].with_shape(shapes.permute(ins[0].shape, attrs["perm"])),
        lambda x, attrs: x.permute(attrs["perm"]),
        rules.no_flops,
        attrs=("perm",),
        layout_only=True,
    )
)
register(
    OpDef(
        Op.EXPAND,
        Kind.BROADCAST,
        1,
        lambda ins, attrs: ins[0].with_shape(shapes.expand(ins[0].shape, attrs["shape"])),
        lambda x, attrs: x.expand(attrs["shape"]),
        rules.no_flops,
        attrs=("shape",),
        doc="broadcast size-1 or new leading dims to `shape` (fully resolved)",
        layout_only=True,
    )
)


def _slice_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    (x,) = ins
    dim, start, end, step = attrs["dim"], attrs["start"], attrs["end"], attrs["step"]
    if not 0 <= dim < x.rank or not 0 <= start <= end <= x.shape[dim] or step < 1:
        raise rules.TypeRuleError(f"bad slice dim={dim} [{start}:{end}:{step}] of {x}")
    shape = list(x.shape)
    shape[dim] = shapes.slice_len(x.shape[dim], start, end, step)
    return x.with_shape(tuple(shape))


def _slice_ref(x: torch.Tensor, attrs: Attrs) -> torch.Tensor:
    index = [slice(None)] * x.dim()
    index[attrs["dim"]] = slice(attrs["start"], attrs["end"], attrs["step"])
    return x[tuple(index)]


register(
    OpDef(
        Op.SLICE,
        Kind.INJECTIVE,
        1,
        _slice_infer,
        _slice_ref,
        rules.no_flops,
        attrs=("dim", "start", "end", "step"),
        doc="start/end already clamped into [0, size] by the frontend; step >= 1",
        layout_only=True,
    )
)


def _cat_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    if len({t.dtype for t in ins}) != 1:
        raise rules.TypeRuleError(f"cat inputs must share a dtype, got {[str(t) for t in ins]}")
    return ins[0].with_shape(shapes.cat([t.shape for t in ins], attrs["dim"]))


register(
    OpDef(
        Op.CAT,
        Kind.INJECTIVE,
        None,
        _cat_infer,
        lambda *args: torch.cat(args[:-1], dim=args[-1]["dim"]),
        rules.no_flops,
        attrs=("dim",),
        layout_only=True,
    )
)


class IndexBounds(enum.Enum):
    """What an EMBEDDING does with its indices. Eager torch checks every index; only x[idx]
    (aten.index) lets a negative index count from the end (embedding, index_select raise)."""

    CHECK = "check"  # every index in [0, rows), else IndexError
    WRAP = "wrap"  # every index in [-rows, rows); negative ones count from the end
    TRUSTED = "trusted"  # in range by construction (as_strided's computed offsets): not checked


def index_bounds(attrs: Attrs) -> IndexBounds:
    return attrs.get("bounds", IndexBounds.CHECK)


def index_out_of_bounds(value: int, dim: int, size: int) -> VfuseIndexError:
    """The error a gather raises (the reference and native kernels say the same)."""
    return VfuseIndexError(f"index {value} is out of bounds for dimension {dim} with size {size}")


def _embedding_ref(table: torch.Tensor, idx: torch.Tensor, attrs: Attrs) -> torch.Tensor:
    bounds, rows = index_bounds(attrs), table.shape[0]
    if bounds is not IndexBounds.TRUSTED and idx.numel():
        lo = -rows if bounds is IndexBounds.WRAP else 0
        bad = (idx < lo) | (idx >= rows)
        if bool(bad.any()):  # the first offending index in row-major order, as the kernels report
            raise index_out_of_bounds(int(idx.flatten()[bad.flatten()][0]), attrs.get("dim", 0), rows)
        if bounds is IndexBounds.WRAP:
            idx = torch.where(idx < 0, idx + rows, idx)
    return F.embedding(idx, table)


def _embedding_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    table, idx = ins
    if table.rank != 2 or idx.dtype not in (DType.I32, DType.I64):
        raise rules.TypeRuleError(f"embedding needs a 2-D table and int indices, got {table}, {idx}")
    return TensorType(idx.shape + table.shape[1:], table.dtype)


register(
    OpDef(
        Op.EMBEDDING,
        Kind.INJECTIVE,
        2,
        _embedding_infer,
        _embedding_ref,
        rules.no_flops,
        bytes=lambda ins, out, attrs: ins[1].nbytes + 2 * out.nbytes,
        doc="inputs (table, indices): gathers rows of the table; attrs bounds (IndexBounds, default "
        "CHECK) and dim (the gathered dim of the frontend op, for messages)",
        layout_only=True,
    )
)
