"""Long-row reductions as SEGMENTS independent SIMD reductions over contiguous segments.

A `#pragma omp simd reduction(+:acc)` loop keeps one vector accumulator, so a 1024-wide
fp32 row is a chain of 64 dependent vector adds (or FMAs, or max) of ~4 cycles each. That
bounds a pass over a row that is already in L1 (LayerNorm's variance pass), not the first
pass over it, which waits on memory (see `use_segments`).
Here a block [rb, re) is cut into SEGMENTS contiguous segments of `rq` elements (a multiple
of VECTOR) walked by one SIMD loop: iteration c reduces element c of every segment into that
segment's own scalar accumulator, which g++ keeps in its own vector register (a reduction
clause each), so SEGMENTS chains run side by side and every load stays contiguous. The
elements past the segments (at most SEGMENTS * VECTOR - 1) go through a plain SIMD loop into
the block's accumulator; the segments are folded pairwise into it. Sums stay blocked by
BLOCK elements (render.py), only their order inside a block changes.

Why not lanes (`lanes.py`) for long rows: their accumulator array stays in memory once g++
no longer unrolls the lane loop completely, so every add waits on a store and a reload.
Named scalars with reduction clauses are what g++ keeps in registers (the hot loop of the
variance pass is 8 loads, 8 subs and 8 FMAs into 8 zmm accumulators, no stack access).
Measured (LayerNorm 8192x1024 kernel alone, interleaved, against one chain): 2 threads 0.80
alone / 0.90 with a GELU epilogue, 1 thread 0.90 / 0.92; the bench's ln_gelu 1.81-1.88 ->
1.60-1.66 ms. g++'s horizontal sum of each accumulator stays a chain of 16 scalar adds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.ir import Op
from vfuse.schedule.kernel import Compute, Kernel, Loop, Pass, Reduce

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

SEGMENTS = 8  # independent chains: 4-cycle FMA latency at two per cycle (4 gained less, 16 too)
VECTOR = 16  # fp32 elements per AVX-512 vector: segment lengths are multiples of it
# A few instructions per element, so the accumulator chain is what a pass waits on.
CHEAP = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.ABS, Op.MAXIMUM, Op.MINIMUM, Op.CAST, Op.WHERE})
REREAD_MAX = 8192  # elements of a row that a later pass still finds in L1 (32 KiB of fp32)


def use_segments(k: Kernel, p: Pass, vec: Loop, parallel: bool) -> bool:
    """A later pass over a row an earlier pass has just brought into L1 (rows of at most
    REREAD_MAX elements), with at least two vectors per segment; a reduction loop split
    between threads already has one chain per thread. The first pass over a row is left
    alone: it waits on memory, not on its adds, and SEGMENTS streams per row instead of one
    sequential stream made it slower (LayerNorm 8192x1024 with both passes segmented: 1.26x
    the time of one chain, 0.80x with the variance pass alone). Bodies with other than CHEAP
    ops are bound by their own instructions, not by the chain: the exp-sum pass of softmax
    8192x1024 got 16 % slower with four copies of vf_exp."""
    if not all(s.op in CHEAP for s in p.body if isinstance(s, Compute)):
        return False
    later = p.reduces != k.passes[0].reduces
    span = math.prod(lp.size for lp in k.inner)
    return not parallel and later and span <= REREAD_MAX and vec.size >= 2 * SEGMENTS * VECTOR


def render_segments(w: KernelWriter, p: Pass, vec: Loop, length: int | None) -> None:
    """Reduce block [rb, re) of `vec` into `<var>_blk` (declared by the caller) through
    segments; `length` is the block's length where every block has the same one."""
    i = w.names[vec.var]
    for r in p.reduces:
        for s in range(SEGMENTS):
            w.declare_acc(r, f"{r.var}_q{s}")
    span = str(length) if length is not None else "(re - rb)"
    w.w(f"const int64_t rq = {span} / {SEGMENTS * VECTOR} * {VECTOR};")
    clauses = " ".join(w.clauses(p.reduces, f"_q{s}") for s in range(SEGMENTS))
    w.w(f"#pragma omp simd {clauses}")
    w.w("for (int64_t c = 0; c < rq; ++c) {")
    w.depth += 1
    for s in range(SEGMENTS):
        # One scope per segment: the body's statements keep their names in each copy.
        w.w("{")
        w.depth += 1
        w.w(f"const int64_t {i} = rb + {s} * rq + c;")
        w.body(p, f"_q{s}")
        w.close()
    w.close()
    if length is None or length % (SEGMENTS * VECTOR):
        w.w(f"#pragma omp simd {w.clauses(p.reduces, '_blk')}")
        w.open_loop(vec, f"rb + {SEGMENTS} * rq", "re")
        w.body(p, "_blk")
        w.close()
    _fold(w, p)


def _fold(w: KernelWriter, p: Pass) -> None:
    """Fold the segments pairwise, then into the block's accumulator (the remainder's)."""
    step = 1
    while step < SEGMENTS:
        for s in range(0, SEGMENTS, 2 * step):
            for r in p.reduces:
                _combine(w, r, f"_q{s}", f"_q{s + step}")
        step *= 2
    for r in p.reduces:
        _combine(w, r, "_blk", "_q0")


def _combine(w: KernelWriter, r: Reduce, into: str, part: str) -> None:
    w.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}{into}", part=f"{r.var}{part}"))
    if w.tracks_nan(r):
        w.w(f"{r.var}{into}_nan |= {r.var}{part}_nan;")
