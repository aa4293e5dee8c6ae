"""Scatter-accumulate: the backward of a gather (embedding, max pooling's saved indices).

SCATTER_ADD(values (B, N, W), index (B, N)[, init (B, R, W)]) -> out (B, R, W):
out starts as zeros (or `init`), then for n = 0, 1, ... in order, out[b, index[b, n], :] +=
values[b, n, :]. With `taps` T > 1 each value feeds T consecutive terms (index (B, N * T): term m
adds values[b, m // T], an average pool's window), and an index of one row (1, N * T) serves
every plane b. Each output element adds its terms in ascending n, the order eager's CPU kernels
(embedding_dense_backward, max_pool2d backward, index_put_ with accumulate) add them, so the
result is bit-reproducible whatever the threads (the schedule splits planes or output rows
between threads, never one element's terms). An index outside [0, R) ([-R, R) with `wrap`, where
negative ones count from the end) raises VfuseIndexError (the first in row-major order); `skip`
(embedding's padding_idx, a pool tap in the padding) drops the terms at that index.
It is Kind.CONTRACTION: a standalone template kernel (`codegen/cpp/scatter.py`), no epilogue.
"""

from __future__ import annotations

import torch

from vfuse.ir.defs import rules
from vfuse.ir.defs.layout import index_out_of_bounds
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type

SCATTER_DTYPES = (DType.F32, DType.F64)


def _infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    values, index = ins[:2]
    rows, taps = attrs["rows"], attrs["taps"]
    terms = (values.shape[1] * taps,) if values.rank == 3 else ()
    if values.rank != 3 or index.rank != 2 or index.shape not in ((values.shape[0], *terms), (1, *terms)):
        raise rules.TypeRuleError(
            f"scatter_add needs values (B, N, W) and index (B or 1, N * {taps} taps), got {values}, {index}"
        )
    if values.dtype not in SCATTER_DTYPES or index.dtype not in (DType.I32, DType.I64):
        raise rules.TypeRuleError(f"scatter_add of {values.dtype.value} at {index.dtype.value} indices")
    out = TensorType((values.shape[0], rows, values.shape[2]), values.dtype)
    if len(ins) == 3 and ins[2] != out:
        raise rules.TypeRuleError(f"scatter_add's init {ins[2]} is not its output {out}")
    return out


def _ref(values: torch.Tensor, index: torch.Tensor, *rest: object) -> torch.Tensor:
    attrs: Attrs = rest[-1]  # type: ignore[assignment]
    b, _, w = values.shape
    rows, skip = attrs["rows"], attrs["skip"]
    values = values.repeat_interleave(attrs["taps"], dim=1)
    index, n = index.expand(b, values.shape[1]), values.shape[1]
    counted = index != skip if skip is not None else torch.ones_like(index, dtype=torch.bool)
    bad = ((index < (-rows if attrs["wrap"] else 0)) | (index >= rows)) & counted
    if bool(bad.any()):  # the first offending index in row-major order, as the kernel reports
        raise index_out_of_bounds(int(index.flatten()[bad.flatten()][0]), attrs["dim"], rows)
    index = torch.where((index < 0) & counted, index + rows, index)
    init = rest[0] if len(rest) == 2 else None
    out = init.clone() if isinstance(init, torch.Tensor) else values.new_zeros((b, rows, w))
    flat = (index.long() + torch.arange(b, device=index.device).unsqueeze(1) * rows).flatten()
    src = values.reshape(b * n, w)
    if skip is not None:
        keep = (index != skip).flatten()
        flat, src = flat[keep], src[keep]
    # index_add_ on CPU adds source rows in order: each element's terms in ascending n. On CUDA it
    # uses atomics; index_put_'s accumulate there sorts the indices (stably) first: deterministic.
    if out.device.type == "cpu":
        return out.view(b * rows, w).index_add_(0, flat, src).view(b, rows, w)
    return out.view(b * rows, w).index_put_((flat,), src, accumulate=True).view(b, rows, w)


def _bytes(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    """Values and indices read once; the output written (zeros or init), then the rows the terms
    reach read and written again (at most every term's, at most the whole output)."""
    terms = ins[0].nbytes
    return sum(t.nbytes for t in ins) + out.nbytes + 2 * min(terms, out.nbytes)


register(
    OpDef(
        Op.SCATTER_ADD,
        Kind.CONTRACTION,
        None,
        _infer,
        _ref,
        lambda ins, out, attrs: ins[0].numel,
        attrs=("rows", "skip", "wrap", "taps", "dim"),
        bytes=_bytes,
        matrix_unit=False,
        doc="inputs (values (B, N, W), index (B or 1, N * taps)[, init (B, R, W)]); out[b, index[b, m]] += "
        "values[b, m // taps] in ascending m from zeros (or init); rows R, skip (an index whose terms are "
        "dropped, in range or not, or None), taps (terms per value: a pool window's), "
        "wrap (indices in [-R, 0) count from the end, as x[idx]), dim (the frontend op's dim, for messages)",
    )
)
