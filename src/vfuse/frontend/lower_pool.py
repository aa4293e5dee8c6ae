"""2-D pooling, forward and backward, as pointwise kernels over the window's taps.

Forward: each of the window's k*k taps is a strided SLICE of the padded input, combined in window
order (max, its index, or the sum for an average). Backward: the gradient of an input element is
the sum over the taps (ti, tj) of the output gradient *spread* to the positions that tap reads
(interleaved with zeros by the stride, shifted by the tap's offset, cropped to the input) - a
bounded loop of layout ops instead of a scatter. Taps are added in reverse order, so every input
element adds its windows' terms in (oh, ow) row-major order, as eager's CPU kernels do; a term
that does not reach an element adds an exact 0. Max pooling's backward routes each gradient
through the saved indices (so ties go where eager's forward put them). On CPU both backwards
are instead SCATTER_ADDs, eager's walk: max through the saved indices (the gather form did ~16x
its work), avg over each window's taps.

Windows that tile the input (kernel == stride, no padding) keep their cheaper forms: a two-axis
row sum forward, a broadcast of grad / (k*k) backward.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import _embed, reshape, slice_
from vfuse.frontend.registry import lowers
from vfuse.ir import ConstValue, DType, Op
from vfuse.ir.defs.layout import IndexBounds
from vfuse.ir.sym import is_sym, proved

aten = torch.ops.aten


class Form(enum.Enum):
    """The pooling lowerings whose cost on CPU is gated against eager's kernel."""

    MAX_INDICES = "max_pool2d_with_indices"
    AVG_BACKWARD = "avg_pool2d_backward"


CPU_TERMS: dict[Form, int | None] = {Form.MAX_INDICES: None, Form.AVG_BACKWARD: 16384}
"""The most window terms (output elements x taps forward, input elements x covering windows
backward) for which the generated kernel beat eager's on CPU (2 threads, docs/perf-log.md
2026-11-30). None: no limit. GPU targets have none (the gather form is how GPU compilers write
these). On CPU the backwards are SCATTER_ADDs (eager's own walk: through the saved indices for
max, over each window's taps for avg), so only an avg backward with symbolic sizes (its tap
table is a constant) still takes the gated gather form. max_pool2d with indices has no limit:
re-measured on a quiet machine it beats eager's from 50K terms up (8x64x56x56 3/2/1: 5.3 vs
6.2 ms; the old 65536-term limit sent exactly those to torch)."""


_SUMMED = (DType.F32, DType.F64)
"""Dtypes whose window sums are added as eager adds them (half types: eager's accumulation in
fp32 is not reproduced, so they run through torch)."""


def _cheap_enough(em: Emitter, form: Form, terms: int) -> None:
    limit = CPU_TERMS[form]
    if em.ctx.options.target == "cpu" and limit is not None and terms > limit:
        raise Fallback(f"{form.value} of {terms} window terms: eager's CPU kernel is faster (more than {limit})")


def _pair(v: Any, default: Any = None) -> tuple[int, int]:
    v = default if not v else v
    return (int(v[0]), int(v[-1])) if isinstance(v, list | tuple) else (int(v), int(v))


@dataclass(frozen=True, slots=True)
class Axis:
    """One spatial axis of a pool: its dim, input and output sizes, and the window's geometry."""

    dim: int
    size: int
    out: int
    kernel: int
    stride: int
    pad: int
    dilation: int

    def start(self, tap: int) -> int:
        """The input position output 0's `tap` reads (negative: in the padding)."""
        return tap * self.dilation - self.pad

    def reads(self, tap: int) -> list[int]:
        return [o * self.stride + self.start(tap) for o in range(self.out)]

    def all_inside(self, tap: int) -> bool:
        if is_sym(self.out) or is_sym(self.size):  # the ends, proved or not: "no" adds a mask
            lo, hi = self.start(tap), (self.out - 1) * self.stride + self.start(tap)
            return proved(0, "<=", lo) and proved(hi, "<", self.size)
        return all(0 <= p < self.size for p in self.reads(tap))

    def any_inside(self, tap: int) -> bool:
        if is_sym(self.out) or is_sym(self.size):  # without a guard: "yes" keeps a masked tap
            lo, hi = self.start(tap), (self.out - 1) * self.stride + self.start(tap)
            return not (proved(hi, "<", 0) or proved(self.size, "<=", lo))
        return any(0 <= p < self.size for p in self.reads(tap))


def _axes(em: Emitter, a: dict, x: str, out_hw: tuple[int, ...]) -> tuple[Axis, Axis]:
    rank = em.ttype(x).rank
    if rank not in (3, 4) or 0 in em.ttype(x).shape:
        raise Fallback("pooling of other than a non-empty 3-D or 4-D input")
    kernel = _pair(a["kernel_size"])
    geometry = zip(kernel, _pair(a["stride"], kernel), _pair(a["padding"]), _pair(a.get("dilation"), 1), strict=True)
    h, w = (
        Axis(rank - 2 + i, em.ttype(x).shape[rank - 2 + i], size_out, k, s, p, d)
        for i, ((k, s, p, d), size_out) in enumerate(zip(geometry, out_hw, strict=True))
    )
    return h, w


def _taps(em: Emitter, x: str, axes: tuple[Axis, Axis], fill: float) -> list[tuple[int, int, str]]:
    """(ti, tj, tap) in window order: x padded with `fill`, sliced at the tap's positions."""
    per_axis: list[list[tuple[int, int, int, int]]] = []
    for ax in axes:
        # ceil_mode's last window may run past the padding: pad with `fill` up to its end.
        covered = (ax.out - 1) * ax.stride + (ax.kernel - 1) * ax.dilation + 1
        x = _embed(em, x, ax.dim, ax.pad, max(0, covered - ax.pad - ax.size), fill)
        per_axis.append([(ax.dim, t * ax.dilation, t * ax.dilation + (ax.out - 1) * ax.stride + 1, ax.stride)
                         for t in range(ax.kernel)])  # fmt: skip
    return [
        (ti, tj, slice_(em, slice_(em, x, *row), *col))
        for ti, row in enumerate(per_axis[0])
        for tj, col in enumerate(per_axis[1])
    ]


def _positions(em: Emitter, ax: Axis, tap: int, scale: int, trailing: int) -> str:
    """The (scaled) input positions `tap` reads along `ax`, shaped (out,) + (1,) * trailing."""
    iota = em.emit(Op.IOTA, length=ax.out, start=ax.start(tap) * scale, step=ax.stride * scale, dtype=DType.I64)
    return reshape(em, iota, (ax.out,) + (1,) * trailing)


def _inside(em: Emitter, ax: Axis, tap: int, trailing: int) -> str | None:
    """Where `tap` reads inside the input along `ax` (bool), None when it always does."""
    if ax.all_inside(tap):
        return None
    pos = _positions(em, ax, tap, 1, trailing)
    lo = em.emit(Op.GE, (pos, em.scalar(0, DType.I64)))
    return em.emit(Op.LOGICAL_AND, (lo, em.emit(Op.LT, (pos, em.scalar(ax.size, DType.I64)))))


def _and(em: Emitter, a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else em.emit(Op.LOGICAL_AND, (a, b))


def _max_with_indices(em: Emitter, x: str, axes: tuple[Axis, Axis], out_shape: tuple[int, ...]) -> tuple[str, str]:
    """torch's CPU loop: over the window's taps inside the input in order, take a tap when
    `val > max || isnan(val)` or it is the first; the index is h * W + w of the input plane."""
    h, w = axes
    best = idx = None
    everywhere = False  # some tap so far reads inside the input at every output: idx is set
    for ti, tj, tap in _taps(em, x, axes, float("-inf")):
        if not (h.any_inside(ti) and w.any_inside(tj)):
            continue
        flat = em.emit(Op.ADD, (_positions(em, h, ti, w.size, 1), _positions(em, w, tj, 1, 0)))
        valid = _and(em, _inside(em, h, ti, 1), _inside(em, w, tj, 0))
        if best is None or idx is None:
            take = valid
        else:
            take = em.emit(Op.LOGICAL_OR, (em.emit(Op.GT, (tap, best)), em.emit(Op.ISNAN, (tap,))))
            if not everywhere:
                take = em.emit(Op.LOGICAL_OR, (take, em.emit(Op.EQ, (idx, em.scalar(-1, DType.I64)))))
            take = _and(em, take, valid)
        best_else = best if best is not None else em.scalar(float("-inf"), em.ttype(x).dtype)
        idx_else = idx if idx is not None else em.scalar(-1, DType.I64)
        best = tap if take is None else em.emit(Op.WHERE, (take, tap, best_else))
        idx = flat if take is None else em.emit(Op.WHERE, (take, flat, idx_else))
        everywhere = everywhere or valid is None
    assert best is not None and idx is not None  # torch rejects windows that lie wholly in the padding
    if em.ttype(idx).shape != out_shape:
        idx = em.emit(Op.EXPAND, (idx,), shape=out_shape)
    return best, idx


@lowers(aten.max_pool2d_with_indices.default)
def lower_max_pool2d(em: Emitter, node: torch.fx.Node) -> tuple[str, str | None]:
    """The maximum of the window's k*k taps, each a strided SLICE of the input padded with -inf,
    so the pool is one pointwise kernel instead of a torch call (ResNet's stem). Without indices:
    taps in window order, a tie keeps the earlier one, NaN wins (MAXIMUM). With indices (training
    saves them for the backward): the same choice made by WHEREs that carry the index along."""
    a = bind(node)
    x = em.value(a["self"])
    if not em.ttype(x).dtype.is_float:
        raise Fallback(f"max_pool2d of {em.ttype(x).dtype.value}")
    axes = _axes(em, a, x, em.out_type(0).shape[-2:])
    if any(u.target is operator.getitem and u.args[1] == 1 for u in node.users):
        _cheap_enough(em, Form.MAX_INDICES, em.out_type(1).numel * axes[0].kernel * axes[1].kernel)
        return _max_with_indices(em, x, axes, em.out_type(1).shape)
    result = None
    for _, _, tap in _taps(em, x, axes, float("-inf")):
        result = tap if result is None else em.emit(Op.MAXIMUM, (result, tap))
    assert result is not None
    return result, None


def _covers(em: Emitter, ax: Axis, j: int) -> tuple[bool, str | None]:
    """Whether the window o = (p + pad) // stride - j covers input position p along ax: (for some
    p, as a bool (size,) CONSTANT or None when for every p)."""
    hits = []
    for p in range(ax.size):
        o = (p + ax.pad) // ax.stride - j
        tap, rem = divmod(p + ax.pad - o * ax.stride, ax.dilation)
        hits.append(0 <= o < ax.out and rem == 0 and tap < ax.kernel)
    if all(hits) or not any(hits):
        return any(hits), None
    return True, em.emit(Op.CONSTANT, value=ConstValue(torch.tensor(hits)))


def _pick(em: Emitter, v: str, ax: Axis, j: int) -> str:
    """y[p] = v[(p + pad) // stride - j] along ax.dim (0 where that is outside v), y the input's
    size there. Layout ops only (a shift, a broadcast over the stride, a slice), so the kernel
    computes each coordinate with a constant division instead of loading a gather index."""
    shape, dim = em.ttype(v).shape, ax.dim
    last = (ax.size - 1 + ax.pad) // ax.stride  # the largest q = (p + pad) // stride
    shifted = slice_(em, v, dim, 0, max(0, last + 1 - j))
    shifted = _embed(em, shifted, dim, j, last + 1 - j - em.ttype(shifted).shape[dim], 0)
    if ax.stride > 1:
        wide = (*shape[:dim], last + 1, ax.stride, *shape[dim + 1 :])
        shifted = reshape(em, shifted, (*shape[:dim], last + 1, 1, *shape[dim + 1 :]))
        shifted = reshape(
            em, em.emit(Op.EXPAND, (shifted,), shape=wide), (*shape[:dim], (last + 1) * ax.stride, *shape[dim + 1 :])
        )
    return slice_(em, shifted, dim, ax.pad, ax.pad + ax.size)


def _windows(ax: Axis) -> int:
    """How many windows can cover one input position along ax."""
    return -(-((ax.kernel - 1) * ax.dilation + 1) // ax.stride)


def _gather_back(em: Emitter, values: list[str], axes: tuple[Axis, Axis], term: Any) -> str | None:
    """sum over the windows (oh, ow) that may cover each input position, oh then ow ascending
    (eager's order), of term(gathered values at (oh, ow), covers) (None: no window covers any)."""
    h, w = axes
    total = None
    for jh in reversed(range(_windows(h))):
        some_row, rows = _covers(em, h, jh)
        for jw in reversed(range(_windows(w))):
            some_col, cols = _covers(em, w, jw)
            if not (some_row and some_col):
                continue
            at = [_pick(em, _pick(em, v, h, jh), w, jw) for v in values]
            t = term(at, _and(em, None if rows is None else reshape(em, rows, (h.size, 1)), cols))
            total = t if total is None else em.emit(Op.ADD, (total, t))
    return total


def _zeros_like(em: Emitter, x: str) -> str:
    t = em.ttype(x)
    return em.emit(Op.FULL, value=0.0, shape=t.shape, dtype=t.dtype)


@lowers(aten.max_pool2d_with_indices_backward.default)
def lower_max_pool2d_backward(em: Emitter, node: torch.fx.Node) -> str:
    """grad_input[p] = sum of grad_output[o] over the windows o covering p whose saved index is p.
    The saved indices pass through a checked gather first: one outside the input plane raises."""
    a = bind(node)
    g, x, saved = em.value(a["grad_output"]), em.value(a["self"]), em.value(a["indices"])
    if (
        em.ttype(x).dtype not in _SUMMED
        or em.ttype(g).dtype is not em.ttype(x).dtype
        or em.ttype(saved).dtype is not DType.I64
    ):
        raise Fallback("max_pool2d backward of other than fp32/fp64 or with non-int64 indices")
    h, w = _axes(em, a, x, em.ttype(g).shape[-2:])
    if em.ctx.options.target == "cpu":
        return _scatter_back(em, g, x, saved, (h, w))
    # Checked against a table of zeros: the kernel checks every index before its loops and
    # reads a constant 0 (a table of positions would cost an i64 modulo per read).
    zeros = em.emit(Op.FULL, value=0, shape=(h.size * w.size, 1), dtype=DType.I64)
    hit = em.emit(Op.EMBEDDING, (zeros, saved), bounds=IndexBounds.CHECK, dim=h.dim)
    checked = em.emit(Op.ADD, (saved, reshape(em, hit, em.ttype(saved).shape)))
    here = em.emit(Op.ADD, (_positions(em, _identity(h), 0, w.size, 1), _positions(em, _identity(w), 0, 1, 0)))
    zero = em.scalar(0, em.ttype(g).dtype)

    def term(at: list[str], covers: str | None) -> str:
        grad, index = at
        take = _and(em, em.emit(Op.EQ, (index, here)), covers)
        assert take is not None
        return em.emit(Op.WHERE, (take, grad, zero))

    return _gather_back(em, [g, checked], (h, w), term) or _zeros_like(em, x)


def _scatter_back(em: Emitter, g: str, x: str, saved: str, axes: tuple[Axis, Axis]) -> str:
    """Eager's CPU walk: per plane, each output's gradient added at its saved index (h * W + w),
    outputs in row-major order (SCATTER_ADD checks every index against the plane)."""
    h, w = axes
    shape = em.ttype(x).shape
    planes, outs = math.prod(shape[:-2]), h.out * w.out
    values = reshape(em, g, (planes, outs, 1))
    index = reshape(em, saved, (planes, outs))
    out = em.emit(Op.SCATTER_ADD, (values, index), rows=h.size * w.size, skip=None, wrap=False, taps=1, dim=h.dim)
    return reshape(em, out, shape)


def _spread(em: Emitter, delta: str, x: str, axes: tuple[Axis, Axis]) -> str:
    """Eager's CPU walk of an average pool's backward: per plane, each window's divided gradient
    added to the inputs it covers, windows in row-major order, taps in window order: a SCATTER_ADD
    with a window's k*k taps per value and one index row (a CONSTANT; -1, skipped, in the padding)
    for every plane."""
    h, w = axes
    shape = em.ttype(x).shape
    taps = [(h.reads(ti), w.reads(tj)) for ti in range(h.kernel) for tj in range(w.kernel)]
    table = [
        ih * w.size + iw if 0 <= ih < h.size and 0 <= iw < w.size else -1
        for oh in range(h.out)
        for ow in range(w.out)
        for rows, cols in taps
        for ih, iw in ((rows[oh], cols[ow]),)
    ]
    index = em.emit(Op.CONSTANT, value=ConstValue(torch.tensor([table], dtype=torch.int32)))
    values = reshape(em, delta, (math.prod(shape[:-2]), h.out * w.out, 1))
    out = em.emit(Op.SCATTER_ADD, (values, index), rows=h.size * w.size, skip=-1, wrap=False, taps=len(taps), dim=h.dim)
    return reshape(em, out, shape)


def _identity(ax: Axis) -> Axis:
    """The axis of the input itself: position p for p in range(size)."""
    return Axis(ax.dim, ax.size, ax.size, 1, 1, 0, 1)


def _tiles(em: Emitter, a: dict, x: str) -> int | None:
    """The window k of a 2-D average pool that tiles the input (kernel == stride, no padding,
    sizes divisible by k, no divisor override), else None."""
    k = _pair(a["kernel_size"])
    stride = _pair(a["stride"], k)
    shape = em.ttype(x).shape
    tiled = k[0] == k[1] == stride[0] == stride[1] and not any(a["padding"]) and a["divisor_override"] is None
    if not tiled or len(shape) not in (3, 4) or shape[-1] % k[0] or shape[-2] % k[0]:
        return None
    return k[0]


def _divisor(em: Emitter, a: dict, axes: tuple[Axis, Axis], dtype: DType) -> str:
    """Each window's divisor as eager's CPU kernel computes it: the override, else the window's
    extent clipped to input + padding (count_include_pad) or to the input, per axis."""
    if a["divisor_override"]:
        return em.scalar(a["divisor_override"], dtype)
    sizes = []
    for ax in axes:
        extents = []
        for o in range(ax.out):
            lo = o * ax.stride - ax.pad
            hi = min(lo + ax.kernel, ax.size + ax.pad)
            if not a["count_include_pad"]:
                lo, hi = max(lo, 0), min(hi, ax.size)
            extents.append(max(hi - lo, 1))
        sizes.append(extents)
    table = torch.tensor([[r * c for c in sizes[1]] for r in sizes[0]], dtype=dtype.torch)
    if bool((table == table[0, 0]).all()):
        return em.scalar(float(table[0, 0]), dtype)
    return em.emit(Op.CONSTANT, value=ConstValue(table))


@lowers(aten.avg_pool2d.default)
def lower_avg_pool2d(em: Emitter, node: torch.fx.Node) -> str:
    """Tiling windows: the input viewed as (..., H/k, k, W/k, k), summed over the two window axes,
    divided by k*k. Others: the window's taps (zero-padded) added in window order, divided."""
    a = bind(node)
    x = em.value(a["self"])
    k = _tiles(em, a, x)
    dtype = em.ttype(x).dtype
    if k is not None:
        *lead, h, w = em.ttype(x).shape
        r = len(lead)
        total = em.emit(Op.SUM, (reshape(em, x, (*lead, h // k, k, w // k, k)),), axes=(r + 1, r + 3), keepdim=False)
        return em.emit(Op.DIV, (total, em.scalar(k * k, dtype)))
    if dtype not in _SUMMED:
        raise Fallback(f"avg_pool2d of {dtype.value} over windows that do not tile the input")
    axes = _axes(em, a, x, em.out_type().shape[-2:])
    total = None
    for _, _, tap in _taps(em, x, axes, 0.0):
        total = tap if total is None else em.emit(Op.ADD, (total, tap))
    assert total is not None
    return em.emit(Op.DIV, (total, _divisor(em, a, axes, dtype)))


@lowers(aten.avg_pool2d_backward.default)
def lower_avg_pool2d_backward(em: Emitter, node: torch.fx.Node) -> str:
    """grad_input[p] = sum of grad_output[o] / divisor[o] over the windows o covering p (eager
    divides each window's gradient once, then adds)."""
    a = bind(node)
    x, g = em.value(a["self"]), em.value(a["grad_output"])
    k = _tiles(em, a, x)
    dtype = em.ttype(x).dtype
    if k is not None:
        shape = em.ttype(x).shape
        *lead, h, w = shape
        g = reshape(em, em.emit(Op.DIV, (g, em.scalar(k * k, dtype))), (*lead, h // k, 1, w // k, 1))
        return reshape(em, em.emit(Op.EXPAND, (g,), shape=(*lead, h // k, k, w // k, k)), shape)
    if dtype not in _SUMMED or em.ttype(g).dtype is not dtype:
        raise Fallback(f"avg_pool2d backward of {dtype.value} over windows that do not tile the input")
    axes = _axes(em, a, x, em.ttype(g).shape[-2:])
    delta = em.emit(Op.DIV, (g, _divisor(em, a, axes, dtype)))
    if em.ctx.options.target == "cpu" and not any(is_sym(d) for d in em.ttype(x).shape):
        return _spread(em, delta, x, axes)
    _cheap_enough(em, Form.AVG_BACKWARD, em.ttype(x).numel * _windows(axes[0]) * _windows(axes[1]))
    zero = em.scalar(0, dtype)

    def term(at: list[str], covers: str | None) -> str:
        return at[0] if covers is None else em.emit(Op.WHERE, (covers, at[0], zero))

    return _gather_back(em, [delta], axes, term) or _zeros_like(em, x)
