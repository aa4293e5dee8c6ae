"""Long-row reductions as strips (`Accumulate.STRIPS`): one SIMD lane loop around several
accumulator chains.

A `#pragma omp simd reduction(+:acc)` loop keeps one vector accumulator, so a 1024-wide fp32
row is a chain of dependent vector adds (or FMAs) of ~4 cycles each, and g++ ends each such
loop with a serial horizontal sum. Here the block [rb, re) is walked by an outer SIMD loop
over the `vector` lanes of one vector; each lane runs `chains` scalar accumulators over the
block in steps of chains x vector elements, chain s taking element j + s * vector + lane. g++
vectorizes the lane loop (outer-loop vectorization): every chain is one vector register, the
loads of one step are contiguous and in order (one sequential stream per row), and the chains
are folded pairwise. The lanes are stored to a `vector`-long array and folded by halving
(vector adds, a few shuffles) instead of g++'s serial horizontal sum. Elements past the last
whole step go through a plain SIMD loop into the block's accumulator. Sums stay blocked; only
their order inside a block changes. The schedule decides where, with how many chains
(`schedule/strategy.py`).
"""

from __future__ import annotations

from vfuse.codegen.cpp.lanes import fold_halving
from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.schedule.kernel import Loop, Pass, Reduce


def render_strips(w: KernelWriter, p: Pass, vec: Loop, length: int) -> None:
    """Reduce block [rb, rb + length) of `vec` into `<var>_blk` (declared by the caller)."""
    chains, vector = p.reduction.chains, p.reduction.vector
    step = chains * vector
    for r in p.reduces:
        w.w(f"{w.acc_type(r)} {r.var}_sp[{vector}];")
    w.w("#pragma omp simd")
    w.open(f"for (int64_t sl = 0; sl < {vector}; ++sl) {{")
    _lane(w, p, vec, length // step * step)
    w.close()
    fold_halving(w, p.reduces, "_sp", vector)
    if length % step:
        w.w(f"#pragma omp simd {w.clauses(p.reduces, '_blk')}")
        w.open_loop(vec, f"rb + {length // step * step}", "re")
        w.body(p, "_blk")
        w.close()
    for r in p.reduces:
        _combine(w, r, "_blk", "_sp[0]")


def _lane(w: KernelWriter, p: Pass, vec: Loop, span: int) -> None:
    """One lane's chains over the first `span` elements of the block, folded pairwise into
    its slot of `_sp`."""
    chains, vector = p.reduction.chains, p.reduction.vector
    i = w.names[vec.var]
    for r in p.reduces:
        for s in range(chains):
            w.declare_acc(r, f"{r.var}_q{s}")
    w.open(f"for (int64_t sj = 0; sj < {span}; sj += {chains * vector}) {{")
    for s in range(chains):
        # One scope per chain: the body's statements keep their names in each copy.
        w.open("{")
        w.w(f"const int64_t {i} = rb + sj + {s * vector} + sl;")
        w.body(p, f"_q{s}")
        w.close()
    w.close()
    half = 1
    while half < chains:
        for s in range(0, chains, 2 * half):
            for r in p.reduces:
                _combine(w, r, f"_q{s}", f"_q{s + half}")
        half *= 2
    for r in p.reduces:
        w.w(f"{r.var}_sp[sl] = {r.var}_q0;")


def _combine(w: KernelWriter, r: Reduce, into: str, part: str) -> None:
    w.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}{into}", part=f"{r.var}{part}"))
