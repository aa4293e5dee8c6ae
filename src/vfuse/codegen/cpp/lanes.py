"""Reduction blocks with several independent accumulators (lanes: `Accumulate.LANES`).

A SIMD reduction `#pragma omp simd reduction(+:acc)` keeps one vector accumulator, so each
block of a row waits on one chain of dependent adds (4 cycles each). Here element i of a
block goes to lane (i - rb) % lanes of an accumulator array, which g++ keeps in several
vector registers (independent chains); the lanes are folded pairwise into the block's
partial at the end (`fold_halving`). Only the summation order changes. Over a row length known
at run time only, whole vectors follow the groups of lanes, and the last partial vector is one
masked step (`Reduction.vector`). The schedule decides where and how many (`schedule/strategy.py`).
"""

from __future__ import annotations

from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.schedule.kernel import Loop, Pass, Reduce


def render_lanes(w: KernelWriter, p: Pass, vec: Loop, into: str) -> None:
    """Reduce block [rb, re) of `vec` through `p.reduction.lanes` lanes and assign the result
    to `<var><into>` (declared by the caller)."""
    lanes, step = p.reduction.lanes, p.reduction.vector
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_ln", lanes)
    w.w("int64_t lb = rb;")
    for n in (lanes, step) if step and step < lanes else (lanes,):
        w.open(f"for (; lb + {n} <= re; lb += {n}) {{")
        _lane_loop(w, p, vec, str(n))
        w.close()
    if step:  # a run-time length: its last partial vector, masked
        w.open("if (lb < re) {")
        _lane_loop(w, p, vec, str(step), "lb + c < re")
        w.close()
    elif vec.size % lanes:  # the row's last, partial group of lanes (rows are one block here)
        _lane_loop(w, p, vec, "re - lb")
    # An OpenMP SIMD reduction here made g++ add the last vector's lanes one after another (a
    # long chain per row and pass); the halving steps are vector adds and a few shuffles.
    fold_halving(w, p.reduces, "_ln", lanes)
    for r in p.reduces:
        w.w(f"{r.var}{into} = {r.var}_ln[0];")


def fold_halving(w: KernelWriter, reduces: tuple[Reduce, ...], array: str, width: int) -> None:
    """Fold each `<var><array>[0:width]` into element 0, halving the width each step: SIMD
    loops down to 4 elements, then plain statements (a loop of one or two is no SIMD loop)."""
    h = width // 2
    while h >= 4:
        w.w("#pragma omp simd")
        w.w(f"for (int64_t c = 0; c < {h}; ++c) {{")
        for r in reduces:
            w.w("  " + REDUCE_RULES[r.op][3].format(acc=f"{r.var}{array}[c]", part=f"{r.var}{array}[c + {h}]"))
        w.w("}")
        h //= 2
    for c, h in ((0, 2), (1, 2), (0, 1)):
        for r in reduces:
            w.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}{array}[{c}]", part=f"{r.var}{array}[{c + h}]"))


def _lane_loop(w: KernelWriter, p: Pass, vec: Loop, count: str, mask: str = "") -> None:
    """Elements lb + c for c < `count` into lanes c; with `mask`, only those where it holds
    (g++ makes the test the mask of masked loads and stores: AVX-512, AVX2). Masked elements
    reduce into a scalar that starts at the identity, added to the lane outside the test: a
    lane updated under it became a masked store, which kept every lane in memory (tiny_graph
    at 49 on AVX-512: 0.58 us per call, 0.48 at 64)."""
    w.w("#pragma omp simd")
    w.open(f"for (int64_t c = 0; c < {count}; ++c) {{")
    if mask:
        for r in p.reduces:
            w.declare_acc(r, f"{r.var}_m")
        w.open(f"if ({mask}) {{")
    w.w(f"const int64_t {w.names[vec.var]} = lb + c;")
    w.body(p, "_m" if mask else "_ln", "" if mask else "[c]")
    if mask:
        w.close()
        for r in p.reduces:
            w.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}_ln[c]", part=f"{r.var}_m"))
    w.close()
