"""Column kernels (`Walk.TILED_COLUMNS`): reductions whose innermost (contiguous) dim is kept,
e.g. sum over axis 0.

Walking each output column's row would read memory with a large stride. Instead a tile of
`Kernel.tile` adjacent columns is reduced together: the reduced loops run outside, the tile
loop is the SIMD loop inside (contiguous loads), and each reduction keeps one accumulator per
column of the tile, blocked along the innermost reduced loop (`Reduction.block` rows per
partial). The schedule decides which kernels and the tile width (`schedule/strategy.py`).
"""

from __future__ import annotations

from vfuse.codegen.cpp.streaming import serial_copy
from vfuse.codegen.cpp.writer import KernelWriter


def render_tiled(w: KernelWriter) -> None:
    k = w.k
    (p,) = k.passes
    *rows, col = k.outer
    tile = k.tile
    v = w.names[col.var]
    at = f"[{v} - cb]"
    collapse = f" collapse({len(rows) + 1})"
    start = w.mark()
    if k.threaded:
        w.w(f"#pragma omp parallel for num_threads(nt) schedule(static){collapse}")
    for lp in rows:
        w.open_loop(lp)
    w.open(f"for (int64_t cb = 0; cb < {col.size}; cb += {tile}) {{")
    w.w(f"const int64_t ce = cb + {tile} < {col.size} ? cb + {tile} : {col.size};")
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_acc", tile)
    _reduce_loops(w, at)
    w.w("#pragma omp simd")
    w.open(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    for s in p.before:  # per-column values (pure, cheap) are needed again by the epilogue
        w.stmt(s)
    for r in p.reduces:
        w.finish(r, at)
    for s in k.after:
        w.stmt(s)
    w.close(2)
    w.close(len(rows))
    if k.threaded:  # threads chosen per call: a serial copy for one thread (`streaming.serial_copy`)
        serial_copy(w, start)


def _reduce_loops(w: KernelWriter, at: str) -> None:
    """R loops outside, the innermost one blocked; the tile loop inside each."""
    k = w.k
    (p,) = k.passes
    *outer_r, last = k.inner
    v = w.names[k.outer[-1].var]
    block = p.reduction.block
    for lp in outer_r:
        w.open_loop(lp)
    w.open(f"for (int64_t rb = 0; rb < {last.size}; rb += {block}) {{")
    w.w(f"const int64_t re = rb + {block} < {last.size} ? rb + {block} : {last.size};")
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_blk", k.tile)
    w.open_loop(last, "rb", "re")
    w.w("#pragma omp simd")
    w.open(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    for s in (*p.before, *p.body):
        w.stmt(s)
    for r in p.reduces:
        w.update(r, f"{r.var}_blk", at)
    w.close(2)
    w.w("#pragma omp simd")
    w.open(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    for r in p.reduces:
        w.combine(r, f"{r.var}_blk", at)
    w.close(2)
    w.close(len(outer_r))
