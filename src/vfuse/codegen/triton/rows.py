"""Row and column kernels (`GpuWalk.ROWS`, `GpuWalk.COLUMNS`): a tile of rows per program.

A ROWS tile is [rows, block]: rows along axis 0, the row's elements along axis 1 (reduced along
axis 1). A COLUMNS tile is [block, columns]: the reduced elements along axis 0, adjacent kept
elements (contiguous in memory) along axis 1. Per-row values have a size-1 reduced axis and
broadcast against per-element ones.

A persistent kernel loads its row once: every pass runs on the same chunk, and a value an
earlier pass computed (or kept in its row buffer) is still in registers. A looped kernel walks
the row in chunks once per pass, recomputing what the pass reads: the schedule's passes map to
loops over the row as they are (LayerNorm: mean, variance, normalize; softmax: max, sum, divide).
"""

from __future__ import annotations

import math

from vfuse.codegen.triton import reduce
from vfuse.codegen.triton.names import LoopGroup
from vfuse.codegen.triton.writer import TritonWriter
from vfuse.schedule.kernel import GpuLaunch, GpuWalk, Kernel, Pass


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
        for i, p in enumerate(k.passes):
            _pass_looped(w, k, p, axis, i)
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
