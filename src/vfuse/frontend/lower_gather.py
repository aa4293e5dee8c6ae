"""Gather lowerings: embedding, index_select, x[idx] (aten.index with one leading index) and
as_strided all become EMBEDDING (row gather) on a suitably reshaped table.

EMBEDDING gathers rows of a 2-D table, so the gathered dim is moved to the front and the rest
flattened into the row; the result is reshaped (and permuted) back. Its `bounds` say what eager
does with an index out of range: x[idx] lets negative ones count from the end, embedding and
index_select raise for them too; as_strided's offsets are in range by construction.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind, python_scalar
from vfuse.frontend.errors import Fallback, LoweringError
from vfuse.frontend.lower_layout import permute, reshape
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op
from vfuse.ir.defs.layout import IndexBounds
from vfuse.ir.shapes import normalize_dim
from vfuse.ir.sym import hint

aten = torch.ops.aten


def gather_rows(em: Emitter, x: str, dim: int, idx: str, bounds: IndexBounds) -> str:
    """out[..., i, ...] = x[..., idx[i], ...] along `dim` (idx of any shape replaces that dim)."""
    t = em.ttype(x)
    if em.ttype(idx).dtype not in (DType.I32, DType.I64):
        raise Fallback("gather indices must be int32 or int64")
    dim = normalize_dim(dim, t.rank)
    order = (dim, *(d for d in range(t.rank) if d != dim))
    rest = tuple(t.shape[d] for d in order[1:])
    table = reshape(em, permute(em, x, order), (t.shape[dim], math.prod(rest)))
    ishape = em.ttype(idx).shape
    out = reshape(em, em.emit(Op.EMBEDDING, (table, idx), bounds=bounds, dim=dim), ishape + rest)
    # out is (index dims..., dims before `dim`..., dims after `dim`...): put the index dims at `dim`.
    k = len(ishape)
    return permute(em, out, [*range(k, k + dim), *range(k), *range(k + dim, k + len(rest))])


@lowers(aten.embedding.default)
def lower_embedding(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    table, idx = em.value(a["weight"]), em.value(a["indices"])
    if em.ttype(idx).dtype not in (DType.I32, DType.I64):
        raise Fallback("embedding indices must be int32 or int64")
    return em.emit(Op.EMBEDDING, (table, idx), bounds=IndexBounds.CHECK, dim=0)


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def lower_as_strided(em: Emitter, node: torch.fx.Node) -> str:
    """A gather from the flattened input at offset + sum(i_k * stride_k) (EMBEDDING on IOTAs).

    as_strided addresses storage, so this is right only when the input's storage is exactly its
    dense row-major elements, as every IR value is; otherwise no IR graph can express it.
    """
    a = bind(node)
    v: Any = a["self"].meta["val"]
    if em.symbols is not None and any(isinstance(d, torch.SymInt) for d in v.shape):
        raise Fallback("as_strided of a tensor with symbolic sizes (its storage size is unknown here)")
    if not (v.is_contiguous() and v.storage_offset() == 0 and v.untyped_storage().nbytes() == v.nbytes):
        raise LoweringError(node, "as_strided of a non-dense view cannot be expressed on logical tensors")
    size, stride, offset = list(a["size"]), list(a["stride"]), a["storage_offset"] or 0
    x = em.value(a["self"])
    numel = em.ttype(x).numel
    if any(d == 0 for d in size):
        return em.emit(Op.FULL, value=python_scalar(0, em.ttype(x).dtype), shape=tuple(size), dtype=em.ttype(x).dtype)
    if offset + sum((d - 1) * s for d, s in zip(size, stride, strict=True)) >= numel or min(stride, default=0) < 0:
        raise Fallback("as_strided reads outside its input")
    index = em.scalar(offset, DType.I64)
    for k, (d, s) in enumerate(zip(size, stride, strict=True)):
        if s != 0 and d != 1:  # a zero stride repeats: the final EXPAND covers it
            iota = em.emit(Op.IOTA, length=d, start=0, step=s, dtype=DType.I64)
            index = em.emit(Op.ADD, (index, reshape(em, iota, (1,) * k + (d,) + (1,) * (len(size) - k - 1))))
    if em.ttype(index).shape != tuple(size):
        index = em.emit(Op.EXPAND, (reshape(em, index, (1,) * len(size)) if not em.ttype(index).shape else index,),
                        shape=tuple(size))  # fmt: skip
    rows = em.emit(Op.EMBEDDING, (reshape(em, x, (numel, 1)), index), bounds=IndexBounds.TRUSTED, dim=0)
    return reshape(em, rows, tuple(size))


@lowers(aten.index_select.default)
def lower_index_select(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    return gather_rows(em, em.value(a["self"]), a["dim"], em.value(a["index"]), IndexBounds.CHECK)


@lowers(aten.index.Tensor)
def lower_index(em: Emitter, node: torch.fx.Node) -> str:
    """x[idx] with one integer index tensor on the first dim; other forms go to torch."""
    a = bind(node)
    indices = list(a["indices"])
    if len(indices) != 1 or indices[0] is None:
        raise Fallback("advanced indexing other than x[int_tensor]")
    return gather_rows(em, em.value(a["self"]), 0, em.value(indices[0]), IndexBounds.WRAP)


@lowers(aten.gather.default)
def lower_gather(em: Emitter, node: torch.fx.Node) -> str:
    """torch.gather: out[..., i, ...] = x[..., index[..., i, ...], ...] along `dim`, index of x's rank.

    Two gathers: the index through a checked table of offsets along `dim` (an index out of range
    raises as in eager, not merely one inside the buffer), then a trusted gather from the flattened
    input at that offset plus the other dims' (HF BERT's token_type_ids buffer)."""
    a = bind(node)
    x, idx = em.value(a["self"]), em.value(a["index"])
    t, ishape = em.ttype(x), em.ttype(em.value(a["index"])).shape
    if em.ttype(idx).dtype is not DType.I64 or a["sparse_grad"]:
        raise Fallback("gather with a non-int64 or sparse-gradient index")
    if len(ishape) != t.rank or t.rank == 0 or 0 in ishape or 0 in t.shape:
        raise Fallback("gather of a scalar or an empty tensor")
    dim = normalize_dim(a["dim"], t.rank)
    strides = [math.prod(t.shape[d + 1 :]) for d in range(t.rank)]
    offsets = em.emit(Op.IOTA, length=t.shape[dim], start=0, step=strides[dim], dtype=DType.I64)
    table = reshape(em, offsets, (t.shape[dim], 1))
    flat = reshape(em, em.emit(Op.EMBEDDING, (table, idx), bounds=IndexBounds.CHECK, dim=dim), ishape)
    for d, size in enumerate(ishape):
        if d != dim and size > 1:
            iota = em.emit(Op.IOTA, length=size, start=0, step=strides[d], dtype=DType.I64)
            flat = em.emit(Op.ADD, (flat, reshape(em, iota, (1,) * d + (size,) + (1,) * (t.rank - d - 1))))
    rows = em.emit(Op.EMBEDDING, (reshape(em, x, (t.numel, 1)), flat), bounds=IndexBounds.TRUSTED, dim=0)
    return reshape(em, rows, ishape)


GPU_ONE_HOT_TERMS = 1 << 24
"""GPU targets: the most one-hot terms (rows x indices x width) the masked-sum form computes; beyond,
a SCATTER_ADD, which the Triton backend runs in torch (TRITON_IN_TORCH). A guard, not a measurement:
GPT-2's 50257-row vocabulary, 1024 tokens of width 768 would be 40 G terms, ~1000x a scatter's."""


@lowers(aten.embedding_dense_backward.default)
def lower_embedding_dense_backward(em: Emitter, node: torch.fx.Node) -> str:
    """grad_weight[r] = sum of grad_output[i] over the indices i equal to r (none for padding_idx),
    added in ascending i, as eager's CPU kernel. CPU (and large tables on GPU targets): a SCATTER_ADD
    of the gradient rows (eager's walk, checking each index). GPU targets: a masked sum over a
    (rows, indices) one-hot, deterministic without atomics, its indices through a checked gather
    of a zero table. Either
    way an index out of range raises VfuseIndexError (eager's backward skips it silently)."""
    a = bind(node)
    g, idx = em.value(a["grad_output"]), em.value(a["indices"])
    rows, gt = int(a["num_weights"]), em.ttype(em.value(a["grad_output"]))
    if (
        a["scale_grad_by_freq"]
        or em.ttype(idx).dtype not in (DType.I32, DType.I64)
        or gt.dtype not in (DType.F32, DType.F64)
    ):
        raise Fallback("embedding backward with scale_grad_by_freq, non-integer indices or other than fp32/fp64")
    n, width = em.ttype(idx).numel, gt.shape[-1] if gt.rank else 1
    if n == 0 or rows == 0 or width == 0:
        return em.emit(Op.FULL, value=0.0, shape=(rows, width), dtype=gt.dtype)
    pad = a["padding_idx"] if 0 <= a["padding_idx"] < rows else None
    if em.ctx.options.target == "cpu" or hint(rows * n * width) > GPU_ONE_HOT_TERMS:
        values, index = reshape(em, g, (1, n, width)), reshape(em, idx, (1, n))
        out = em.emit(Op.SCATTER_ADD, (values, index), rows=rows, skip=pad, wrap=False, taps=1, dim=0)
        return reshape(em, out, (rows, width))
    flat = reshape(em, idx, (n,))
    zeros = em.emit(Op.FULL, value=0, shape=(rows, 1), dtype=em.ttype(idx).dtype)
    hit = em.emit(Op.EMBEDDING, (zeros, flat), bounds=IndexBounds.CHECK, dim=0)
    checked = em.emit(Op.ADD, (reshape(em, flat, (1, n, 1)), reshape(em, hit, (1, n, 1))))
    row = reshape(em, em.emit(Op.IOTA, length=rows, start=0, step=1, dtype=em.ttype(idx).dtype), (rows, 1, 1))
    mask = em.emit(Op.EQ, (row, checked))
    if pad is not None:
        mask = em.emit(Op.LOGICAL_AND, (mask, em.emit(Op.NE, (row, em.scalar(pad, em.ttype(row).dtype)))))
    terms = em.emit(Op.WHERE, (mask, reshape(em, g, (1, n, width)), em.scalar(0, gt.dtype)))
    return em.emit(Op.SUM, (terms,), axes=(1,), keepdim=False)


def _zeros(em: Emitter, v: str) -> bool:
    """Whether `v` is a FULL of +0.0 (a scatter onto it needs no init: the template zeroes)."""
    node = next((n for n in reversed(em.nodes) if n.name == v), None)
    value = node.attrs["value"] if node is not None and node.op is Op.FULL else None
    return isinstance(value, int | float) and value == 0 and math.copysign(1.0, value) > 0


def _scatter(em: Emitter, x: str, values: str, index: str, *, wrap: bool, dim: int) -> str:
    """SCATTER_ADD of values (B, N, W) at index (B, N) onto x viewed as (B, R, W): x's shape."""
    b, _, w = em.ttype(values).shape
    rows = em.ttype(x).numel // (b * w)
    ins = (values, index) if _zeros(em, x) else (values, index, reshape(em, x, (b, rows, w)))
    return em.emit(Op.SCATTER_ADD, ins, rows=rows, skip=None, wrap=wrap, taps=1, dim=dim)


def _cpu_scatter(em: Emitter, x: str, index: str, what: str) -> None:
    t = em.ttype(x)
    if em.ctx.options.target != "cpu" or t.dtype not in (DType.F32, DType.F64) or t.rank == 0 or 0 in t.shape:
        raise Fallback(f"{what} other than on CPU of a non-empty fp32/fp64 tensor")
    if em.ttype(index).dtype not in (DType.I32, DType.I64) or em.ttype(index).numel == 0:
        raise Fallback(f"{what} with other than int32/int64 indices, or none")


@lowers(aten.index_put.default)
def lower_index_put(em: Emitter, node: torch.fx.Node) -> str:
    """x[idx] += v (accumulate=True, one index tensor on dim 0; the backward of x[idx]): a SCATTER_ADD
    onto x's rows, terms in index order (eager's CPU kernel adds them in no fixed order on several
    threads; the single-thread order here), negative indices counting from the end."""
    a = bind(node)
    indices = list(a["indices"])
    if not a["accumulate"] or len(indices) != 1 or indices[0] is None:
        raise Fallback("index_put other than x[int_tensor] += values")
    x, idx, v = em.value(a["self"]), em.value(indices[0]), em.value(a["values"])
    _cpu_scatter(em, x, idx, "index_put")
    t = em.ttype(x)
    width, n = math.prod(t.shape[1:]), em.ttype(idx).numel
    full = em.ttype(idx).shape + t.shape[1:]
    if em.ttype(v).dtype is not t.dtype:
        raise Fallback("index_put of values of another dtype")
    if em.ttype(v).shape != full:
        v = em.emit(Op.EXPAND, (v,), shape=full)
    out = _scatter(em, x, reshape(em, v, (1, n, width)), reshape(em, idx, (1, n)), wrap=True, dim=0)
    return reshape(em, out, t.shape)


@lowers(aten.scatter_add.default)
def lower_scatter_add(em: Emitter, node: torch.fx.Node) -> str:
    """x.scatter_add(dim, index, src) with index and src of one shape, equal to x's but along dim:
    the dim moved last, a SCATTER_ADD per line along it (eager adds each line's terms in order)."""
    a = bind(node)
    x, idx, src = em.value(a["self"]), em.value(a["index"]), em.value(a["src"])
    _cpu_scatter(em, x, idx, "scatter_add")
    t, shape = em.ttype(x), em.ttype(idx).shape
    dim = normalize_dim(a["dim"], t.rank)
    if em.ttype(src).shape != shape or em.ttype(src).dtype is not t.dtype or len(shape) != t.rank:
        raise Fallback("scatter_add with src not of index's shape or x's dtype")
    if any(s != e for d, (s, e) in enumerate(zip(shape, t.shape, strict=True)) if d != dim):
        raise Fallback("scatter_add with an index smaller than x outside dim")
    perm = [*(d for d in range(t.rank) if d != dim), dim]
    lines = math.prod(shape) // shape[dim]
    values = reshape(em, permute(em, src, perm), (lines, shape[dim], 1))
    index = reshape(em, permute(em, idx, perm), (lines, shape[dim]))
    moved = permute(em, x, perm)
    out = reshape(em, _scatter(em, moved, values, index, wrap=False, dim=dim), em.ttype(moved).shape)
    return permute(em, out, [perm.index(d) for d in range(t.rank)])


@lowers(aten.index_add.default)
def lower_index_add(em: Emitter, node: torch.fx.Node) -> str:
    """x.index_add(dim, index, source) (alpha 1): x viewed as (before dim, dim, after dim), a
    SCATTER_ADD of source's slices in index order (eager's), one index row serving every leading
    plane; an index outside [0, size) raises, as eager."""
    a = bind(node)
    x, idx, src = em.value(a["self"]), em.value(a["index"]), em.value(a["source"])
    _cpu_scatter(em, x, idx, "index_add")
    t = em.ttype(x)
    dim = normalize_dim(a["dim"], t.rank)
    n = em.ttype(idx).numel
    if a["alpha"] != 1 or em.ttype(idx).rank > 1 or em.ttype(src).dtype is not t.dtype:
        raise Fallback("index_add with alpha, a multi-dim index or source of another dtype")
    if em.ttype(src).shape != (*t.shape[:dim], n, *t.shape[dim + 1 :]):
        raise Fallback("index_add with a source not of x's shape along the other dims")
    planes, width = math.prod(t.shape[:dim]), math.prod(t.shape[dim + 1 :])
    index = reshape(em, idx, (1, n))  # one index row serves every plane
    out = _scatter(em, x, reshape(em, src, (planes, n, width)), index, wrap=False, dim=dim)
    return reshape(em, out, t.shape)
