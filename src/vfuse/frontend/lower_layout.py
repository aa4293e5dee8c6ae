"""Layout lowerings: views and copies become RESHAPE, PERMUTE, EXPAND, SLICE and CAT.

IR values are logical (contiguous row-major) tensors, so every view is an index map on its
input and aliasing no longer matters: clone/contiguous/alias/detach are the identity. Target
shapes come from meta['val'], which already resolves -1s and squeezes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind, python_scalar
from vfuse.frontend.errors import Fallback
from vfuse.frontend.registry import lowers
from vfuse.ir import Op
from vfuse.ir.shapes import clamp_slice, normalize_dim
from vfuse.ir.sym import is_sym, same

aten = torch.ops.aten


def reshape(em: Emitter, x: str, shape: Sequence[int]) -> str:
    shape = tuple(d if is_sym(d) else int(d) for d in shape)
    return x if same(em.ttype(x).shape, shape) else em.emit(Op.RESHAPE, (x,), shape=shape)


def permute(em: Emitter, x: str, perm: Sequence[int]) -> str:
    rank = em.ttype(x).rank
    perm = tuple(normalize_dim(p, rank) for p in perm)
    return x if perm == tuple(range(rank)) else em.emit(Op.PERMUTE, (x,), perm=perm)


def slice_(em: Emitter, x: str, dim: int, start: int | None, end: int | None, step: int = 1) -> str:
    """x[..., start:end:step, ...] along `dim`, start/end clamped like torch."""
    shape = em.ttype(x).shape
    dim = normalize_dim(dim, len(shape))
    size = shape[dim]
    lo, hi = clamp_slice(size, 0 if start is None else start, size if end is None else end)
    if same((lo, hi, step), (0, size, 1)):  # structurally: `x[:, :t]` of a t-long buffer is no guard on t
        return x
    return em.emit(Op.SLICE, (x,), dim=dim, start=lo, end=hi, step=step)


@lowers(aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy, aten.contiguous, aten.alias_copy, aten.detach_copy)
def lower_identity(em: Emitter, node: torch.fx.Node) -> str:
    return em.value(node.args[0])


@lowers(
    aten.view.default, aten._unsafe_view, aten.reshape, aten.view_copy.default, aten.squeeze, aten.unsqueeze,
    aten.squeeze_copy, aten.unsqueeze_copy, aten.flatten.using_ints, aten.unflatten.int, aten._reshape_alias,
)  # fmt: skip
def lower_reshape(em: Emitter, node: torch.fx.Node) -> str:
    return reshape(em, em.value(node.args[0]), em.out_type().shape)


@lowers(aten.expand.default, aten.expand_copy.default)
def lower_expand(em: Emitter, node: torch.fx.Node) -> str:
    x, shape = em.value(node.args[0]), em.out_type().shape
    return x if same(em.ttype(x).shape, shape) else em.emit(Op.EXPAND, (x,), shape=shape)


@lowers(aten.permute, aten.permute_copy)
def lower_permute(em: Emitter, node: torch.fx.Node) -> str:
    return permute(em, em.value(node.args[0]), node.args[1])  # type: ignore[arg-type]


@lowers(aten.t, aten.t_copy, aten.numpy_T)
def lower_t(em: Emitter, node: torch.fx.Node) -> str:
    x = em.value(node.args[0])
    return permute(em, x, tuple(reversed(range(em.ttype(x).rank))))


@lowers(aten.transpose.int, aten.transpose_copy.int)
def lower_transpose(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.value(a["self"])
    rank = em.ttype(x).rank
    perm = list(range(rank))
    d0, d1 = normalize_dim(a["dim0"], rank), normalize_dim(a["dim1"], rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute(em, x, perm)


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def lower_slice(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    return slice_(em, em.value(a["self"]), a["dim"], a["start"], a["end"], a["step"])


@lowers(aten.narrow.default)
def lower_narrow(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x = em.value(a["self"])
    start = a["start"] if a["start"] >= 0 else a["start"] + em.ttype(x).shape[normalize_dim(a["dim"], em.ttype(x).rank)]
    return slice_(em, x, a["dim"], start, start + a["length"])


def select(em: Emitter, x: str, dim: int, index: int) -> str:
    shape = em.ttype(x).shape
    dim = normalize_dim(dim, len(shape))
    index = index + shape[dim] if index < 0 else index
    if not 0 <= index < shape[dim]:
        raise Fallback(f"select index {index} out of range for size {shape[dim]}")  # torch raises
    picked = em.emit(Op.SLICE, (x,), dim=dim, start=index, end=index + 1, step=1)
    return reshape(em, picked, shape[:dim] + shape[dim + 1 :])


@lowers(aten.select.int, aten.select_copy.int)
def lower_select(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    return select(em, em.value(a["self"]), a["dim"], a["index"])


@lowers(aten.cat.default)
def lower_cat(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    out = em.out_type()
    dim = normalize_dim(a["dim"], out.rank)
    # torch still accepts legacy 1-D empty tensors next to tensors of any rank; they add nothing.
    parts = [em.cast(em.value(t), out.dtype) for t in a["tensors"]]
    parts = [p for p in parts if em.ttype(p).rank == out.rank]
    return parts[0] if len(parts) == 1 else em.emit(Op.CAT, parts, dim=dim)


def _split_at(em: Emitter, x: str, dim: int, sizes: Sequence[int]) -> tuple[str, ...]:
    outs, start = [], 0
    for size in sizes:
        outs.append(slice_(em, x, dim, start, start + size))
        start += size
    return tuple(outs)


@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def lower_split(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    a = bind(node)
    x = em.value(a["self"])
    return _split_at(em, x, a["dim"], [t.shape[normalize_dim(a["dim"], t.dim())] for t in node.meta["val"]])


@lowers(aten.split_with_sizes, aten.split_with_sizes_copy)
def lower_split_with_sizes(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    a = bind(node)
    return _split_at(em, em.value(a["self"]), a["dim"], a["split_sizes"])


@lowers(aten.unbind.int, aten.unbind_copy.int)
def lower_unbind(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    a = bind(node)
    x = em.value(a["self"])
    dim = normalize_dim(a["dim"], em.ttype(x).rank)
    return tuple(select(em, x, dim, i) for i in range(em.ttype(x).shape[dim]))


@lowers(aten.copy.default)
def lower_copy(em: Emitter, node: torch.fx.Node) -> str:
    """Functional copy_: src broadcast to self's shape and converted to self's dtype."""
    a = bind(node)
    out = em.out_type()
    src = em.cast(em.value(a["src"]), out.dtype)
    return src if em.ttype(src).shape == out.shape else em.emit(Op.EXPAND, (src,), shape=out.shape)


@lowers(aten.constant_pad_nd.default)
def lower_constant_pad(em: Emitter, node: torch.fx.Node) -> str:
    """Pad (left, right) pairs from the last dim backwards: CAT with FULLs, SLICE when negative."""
    a = bind(node)
    x, pad = em.value(a["self"]), list(a["pad"])
    for i in range(len(pad) // 2):
        dim = em.ttype(x).rank - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        x = slice_(em, x, dim, max(0, -left), em.ttype(x).shape[dim] - max(0, -right))
        x = _embed(em, x, dim, left, right, a["value"])
    return x


def _pad_block(em: Emitter, x: str, dim: int, width: int, value: Any) -> str | None:
    """A block of `value` shaped like x but `width` wide along dim (None when width <= 0)."""
    if width <= 0:
        return None
    t = em.ttype(x)
    shape = (*t.shape[:dim], width, *t.shape[dim + 1 :])
    return em.emit(Op.FULL, value=python_scalar(value, t.dtype), shape=shape, dtype=t.dtype)


@lowers(aten.slice_backward.default)
def lower_slice_backward(em: Emitter, node: torch.fx.Node) -> str:
    """Zeros of input_sizes with grad at [start:end] along dim (step 1): a CAT with zero blocks."""
    a = bind(node)
    if a["step"] != 1:
        raise Fallback("slice_backward with a step")
    size = a["input_sizes"][normalize_dim(a["dim"], len(a["input_sizes"]))]
    lo, hi = clamp_slice(size, a["start"], a["end"])
    return _embed(em, em.value(a["grad_output"]), a["dim"], lo, size - hi)


@lowers(aten.select_backward.default)
def lower_select_backward(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    sizes = list(a["input_sizes"])
    dim = normalize_dim(a["dim"], len(sizes))
    index = a["index"] + sizes[dim] if a["index"] < 0 else a["index"]
    grad = reshape(em, em.value(a["grad_output"]), [*sizes[:dim], 1, *sizes[dim + 1 :]])
    return _embed(em, grad, dim, index, sizes[dim] - index - 1)


def _embed(em: Emitter, x: str, dim: int, before: int, after: int, value: Any = 0) -> str:
    """x with `before` blocks of `value` in front of it and `after` behind it along dim."""
    dim = normalize_dim(dim, em.ttype(x).rank)
    parts = [_pad_block(em, x, dim, before, value), x, _pad_block(em, x, dim, after, value)]
    parts = [p for p in parts if p is not None]
    return parts[0] if len(parts) == 1 else em.emit(Op.CAT, parts, dim=dim)
