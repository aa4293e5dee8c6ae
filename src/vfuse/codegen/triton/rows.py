"""Row and column kernels (`GpuWalk.ROWS`, `GpuWalk.COLUMNS`): a tile of rows per program.

A ROWS tile is [rows, block]: rows along axis 0, the row's elements along axis 1 (reduced along
axis 1). A COLUMNS tile is [block, columns]: the reduced elements along axis 0, adjacent kept
elements (contiguous in memory) along axis 1. Per-row values have a size-1 reduced axis and
broadcast against per-element ones.

A persistent kernel loads its row once: every pass runs on the same chunk, and a value an
earlier pass computed (or kept in its row buffer) is still in registers. A looped kernel walks
the row in chunks once per pass, recomputing what the pass reads, except for the pairs of passes
the schedule merged (`GpuLaunch.merges`): LayerNorm's mean and variance are one walk (Welford:
per-lane count, mean and M2, merged per row with Chan's formula), softmax's max and sum are one
(online softmax: per-lane running max, the lane's sum rescaled when it grows); then one walk
normalizes and stores. Two reads of the row instead of three.
"""

from __future__ import annotations

import math

from vfuse.codegen.triton import reduce
from vfuse.codegen.triton.names import LoopGroup
from vfuse.codegen.triton.writer import TritonWriter
from vfuse.schedule.kernel import GpuLaunch, GpuWalk, Kernel, Pass
from vfuse.schedule.rowmerge import RowMerge, RowMethod


def tile_axes(g: GpuLaunch) -> tuple[str, str, int]:
    """(row-axis expansion, element-axis expansion, reduced axis) of the tile."""
    return ("[:, None]", "[None, :]", 1) if g.walk is GpuWalk.ROWS else ("[None, :]", "[:, None]", 0)


def groups(k: Kernel) -> tuple[LoopGroup, LoopGroup]:
    return LoopGroup("ro_", k.outer), LoopGroup("ri_", k.inner)


def render_rows(w: TritonWriter, k: Kernel) -> None:
    """The body of a ROWS / COLUMNS kernel function."""
    g = k.gpu
    assert g is not None
    outer, inner = groups(k)
    row_axis, _, axis = tile_axes(g)
    pid = "tl.program_id(0).to(tl.int64)" if g.wide else "tl.program_id(0)"
    w.w(f"pid_ = {pid}")
    w.w(f"ro_ = pid_ * {g.rows} + tl.arange(0, {g.rows}){row_axis}")
    w.w(f"rm_ = ro_ < {math.prod(lp.size for lp in k.outer)}")
    top = w.mark()
    if g.persistent:
        chunk = _open_chunk(w, k, "0")
        for i, p in enumerate(k.passes):
            _pass_persistent(w, k, p, axis, i)
        w.insert(chunk, w.index.take(inner))
    else:
        merged = {m.first: m for m in g.merges}
        i = 0
        while i < len(k.passes):
            if i in merged:
                _pass_merged(w, k, merged[i], axis)
                i += 2
                continue
            _pass_looped(w, k, k.passes[i], axis, i)
            i += 1
    w.mask = "rm_"
    for s in k.after:
        w.emit_with_deps(s)
    w.insert(top, w.index.take(outer))


def _open_chunk(w: TritonWriter, k: Kernel, start: str) -> tuple[int, int]:
    """The chunk's element indices and masks; returns where its index names go."""
    g = k.gpu
    assert g is not None
    _, elem_axis, _ = tile_axes(g)
    base = "" if start == "0" else f"{start} + "
    w.w(f"ri_ = {base}tl.arange(0, {g.block}){elem_axis}")
    w.w(f"m_ = rm_ & (ri_ < {math.prod(lp.size for lp in k.inner)})")
    return w.mark()


def _before(w: TritonWriter, p: Pass) -> None:
    w.mask = "rm_"
    for s in p.before:
        w.emit_with_deps(s)
    w.hoist_recips(p.recips)


def _body(w: TritonWriter, p: Pass, first: bool) -> None:
    w.mask = "m_"
    for s in p.body:
        w.emit_with_deps(s)
    for r in p.reduces:
        w.emit_deps(r)
        reduce.update(w, r, first)


def _pass_persistent(w: TritonWriter, k: Kernel, p: Pass, axis: int, i: int) -> None:
    w.w(f"# pass {i}")
    _before(w, p)
    _body(w, p, first=True)
    for r in p.reduces:
        reduce.finish(w, r, axis)


def _pass_looped(w: TritonWriter, k: Kernel, p: Pass, axis: int, i: int) -> None:
    g = k.gpu
    assert g is not None
    w.w(f"# pass {i}")
    _before(w, p)
    shape = f"[{g.rows}, {g.block}]" if axis == 1 else f"[{g.block}, {g.rows}]"
    for r in p.reduces:
        reduce.init(w, r, shape)
    outside = set(w.defined)
    row = math.prod(lp.size for lp in k.inner)
    w.w(f"for c0_ in range(0, {row}, {g.block}):")
    w.depth += 1
    chunk = _open_chunk(w, k, "c0_")
    _body(w, p, first=False)
    w.insert(chunk, w.index.take(groups(k)[1]))
    w.depth -= 1
    w.defined = outside
    for r in p.reduces:
        reduce.finish(w, r, axis)


def _pass_merged(w: TritonWriter, k: Kernel, m: RowMerge, axis: int) -> None:
    """Passes `m.first` and `m.first + 1` in one walk of the row: the first pass's reduction as
    it is, the second's from per-lane statistics of `m.x`, folded per row after `b.before`."""
    g = k.gpu
    assert g is not None
    a, b = k.passes[m.first], k.passes[m.first + 1]
    ra, rb = a.reduces[0], next(r for r in b.reduces if r.var != m.deviations)
    w.w(f"# passes {m.first} and {m.first + 1}: {m.method.value}, one walk of the row")
    _before(w, a)
    shape = f"[{g.rows}, {g.block}]" if axis == 1 else f"[{g.block}, {g.rows}]"
    reduce.init(w, ra, shape)
    acc, v = reduce.acc_type(rb), rb.var
    names = ("_n", "_mu", "_m2") if m.method is RowMethod.WELFORD else ("_acc",)
    for n in names:
        w.w(f"{v}{n} = tl.full({shape}, 0, {acc})")
    outside = set(w.defined)
    w.w(f"for c0_ in range(0, {math.prod(lp.size for lp in k.inner)}, {g.block}):")
    w.depth += 1
    chunk = _open_chunk(w, k, "c0_")
    if m.method is RowMethod.ONLINE_SOFTMAX:
        w.w(f"{v}_mo = {ra.var}_acc")  # the lanes' max before this chunk
    _body(w, a, first=False)
    w.mask = "m_"
    (_welford_update if m.method is RowMethod.WELFORD else _online_update)(w, m, v, ra.var, acc)
    w.insert(chunk, w.index.take(groups(k)[1]))
    w.depth -= 1
    w.defined = outside
    reduce.finish(w, ra, axis)
    _before(w, b)
    if m.method is RowMethod.WELFORD:
        _welford_fold(w, m, v, axis)
        return
    # sum(exp(x - max)) over a lane = its sum times exp(lane max - row max); a NaN or infinite
    # row max gives NaN, as the two passes do
    w.w(f"{v} = tl.reduce({v}_acc * tl.exp({ra.var}_acc - {ra.var}), {axis}, _vf_add, keep_dims=True)")
    w.defined.add(v)


def _welford_fold(w: TritonWriter, m: RowMerge, v: str, axis: int) -> None:
    """Over a lane, for any c: sum((x - c)^2) = M2 + n (mean - c)^2 and sum(x - c) = n (mean - c);
    empty lanes add nothing."""
    w.w(f"{v}_dc = {v}_mu - {m.shift}")
    total = f"tl.where({v}_n > 0, {v}_m2 + {v}_n * {v}_dc * {v}_dc, 0)"
    w.w(f"{v} = tl.reduce({total}, {axis}, _vf_add, keep_dims=True)")
    w.defined.add(v)
    if m.deviations:
        w.w(f"{m.deviations} = tl.reduce(tl.where({v}_n > 0, {v}_n * {v}_dc, 0), {axis}, _vf_add, keep_dims=True)")
        w.defined.add(m.deviations)


def _welford_update(w: TritonWriter, m: RowMerge, v: str, _: str, acc: str) -> None:
    one = f"tl.full([], 1, {acc})"
    w.w(f"{v}_n = {v}_n + tl.where(m_, {one}, 0)")
    w.w(f"{v}_d = tl.where(m_, {m.x} - {v}_mu, 0)")
    w.w(f"{v}_mu = {v}_mu + {v}_d / tl.maximum({v}_n, {one})")
    w.w(f"{v}_m2 = {v}_m2 + tl.where(m_, {v}_d * ({m.x} - {v}_mu), 0)")


def _online_update(w: TritonWriter, m: RowMerge, v: str, top: str, acc: str) -> None:
    """The lane's sum rescaled to its new max (unchanged max: exactly 1, -inf too); NaN elements
    are left out (the row max is NaN then, and so the row's sum)."""
    one, mx = f"tl.full([], 1, {acc})", f"{top}_acc"
    w.w(f"{v}_s = tl.where({v}_mo == {mx}, {one}, tl.exp({v}_mo - {mx}))")
    w.w(f"{v}_e = tl.where({m.x} == {mx}, {one}, tl.exp({m.x} - {mx}))")
    w.w(f"{v}_acc = {v}_acc * {v}_s + tl.where(m_ & ({m.x} == {m.x}), {v}_e, 0)")
