"""Reduction blocks with several independent accumulators (lanes).

A SIMD reduction `#pragma omp simd reduction(+:acc)` keeps one vector accumulator, so each
block of a row waits on one chain of dependent adds (4 cycles each): a LayerNorm over 256
floats spends most of its time there. Here element i of a block goes to lane (i - rb) % LANES
of an accumulator array, which g++ keeps in LANES / 16 vector registers (independent chains);
the lanes are folded pairwise into the block's partial at the end (`_fold`).
Only the summation order changes (sums are still blocked by BLOCK elements). Used for short
rows only (`use_lanes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.schedule.kernel import Loop, Pass, Reduce

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

LANES = 64  # 4 AVX-512 vectors of fp32: 4 independent chains hide the add latency


def use_lanes(p: Pass, vec: Loop, tracks_nan: Callable[[Reduce], bool]) -> bool:
    """Lanes pay off only while g++ unrolls the lane loop completely, which keeps the lanes
    in registers: rows of 2 to 4 x LANES elements. Longer rows keep the lane array in memory
    and got slower, as did NaN-tracking max/min (docs/perf-log.md)."""
    return 2 * LANES <= vec.size <= 4 * LANES and not any(tracks_nan(r) for r in p.reduces)


def render_lanes(w: KernelWriter, p: Pass, vec: Loop, into: str) -> None:
    """Reduce block [rb, re) of `vec` through lanes and assign the result to `<var><into>`
    (declared by the caller)."""
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_ln", LANES)
    w.w("int64_t lb = rb;")
    w.w(f"for (; lb + {LANES} <= re; lb += {LANES}) {{")
    w.depth += 1
    _lane_loop(w, p, vec, str(LANES))
    w.close()
    if vec.size % LANES:  # the row's last, partial group of lanes (rows are one block here)
        _lane_loop(w, p, vec, "re - lb")
    _fold(w, p)
    for r in p.reduces:
        w.w(f"{r.var}{into} = {r.var}_ln[0];")


def _fold(w: KernelWriter, p: Pass) -> None:
    """Fold the lanes into lane 0 pairwise. An OpenMP SIMD reduction here made g++ add the
    last vector's 16 lanes one after another (a ~50-cycle chain per row and pass); the
    halving steps are vector adds and a few shuffles."""
    fold_halving(w, p.reduces, "_ln", LANES)


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


def _lane_loop(w: KernelWriter, p: Pass, vec: Loop, count: str) -> None:
    w.w("#pragma omp simd")
    w.w(f"for (int64_t c = 0; c < {count}; ++c) {{")
    w.depth += 1
    w.w(f"const int64_t {w.names[vec.var]} = lb + c;")
    w.body(p, "_ln", "[c]")
    w.close()
