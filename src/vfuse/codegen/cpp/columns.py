"""Column kernels: reductions whose innermost (contiguous) dim is kept, e.g. sum over axis 0.

Walking each output column's row would read memory with a large stride. Instead a tile of
`tile` adjacent columns is reduced together: the reduced loops run outside, the tile loop is
the SIMD loop inside (contiguous loads), and each reduction keeps one accumulator per column
of the tile. The schedule only picks this for single-pass kernels without row buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

BLOCK = 1024  # rows per partial accumulator, as in row kernels


def render_tiled(w: KernelWriter) -> None:
    k = w.k
    (p,) = k.passes
    *rows, col = k.outer
    tile = k.tile
    v = w.names[col.var]
    at = f"[{v} - cb]"
    collapse = f" collapse({len(rows) + 1})"
    if w.threaded:
        w.w(f"#pragma omp parallel for num_threads(nt) schedule(static){collapse}")
    for lp in rows:
        w.open_loop(lp)
    w.w(f"for (int64_t cb = 0; cb < {col.size}; cb += {tile}) {{")
    w.depth += 1
    w.w(f"const int64_t ce = cb + {tile} < {col.size} ? cb + {tile} : {col.size};")
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_acc", tile)
    _reduce_loops(w, at)
    w.w("#pragma omp simd")
    w.w(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    w.depth += 1
    for s in p.before:  # per-column values (pure, cheap) are needed again by the epilogue
        w.stmt(s)
    for r in p.reduces:
        w.finish(r, at)
    for s in k.after:
        w.stmt(s)
    w.close(2)
    w.close(len(rows))


def _reduce_loops(w: KernelWriter, at: str) -> None:
    """R loops outside, the innermost one blocked; the tile loop inside each."""
    k = w.k
    (p,) = k.passes
    *outer_r, last = k.inner
    v = w.names[k.outer[-1].var]
    for lp in outer_r:
        w.open_loop(lp)
    w.w(f"for (int64_t rb = 0; rb < {last.size}; rb += {BLOCK}) {{")
    w.depth += 1
    w.w(f"const int64_t re = rb + {BLOCK} < {last.size} ? rb + {BLOCK} : {last.size};")
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_blk", k.tile)
    w.open_loop(last, "rb", "re")
    w.w("#pragma omp simd")
    w.w(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    w.depth += 1
    for s in (*p.before, *p.body):
        w.stmt(s)
    for r in p.reduces:
        w.update(r, f"{r.var}_blk", at)
    w.close(2)
    w.w("#pragma omp simd")
    w.w(f"for (int64_t {v} = cb; {v} < ce; ++{v}) {{")
    w.depth += 1
    for r in p.reduces:
        w.combine(r, f"{r.var}_blk", at)
    w.close(2)
    w.close(len(outer_r))
