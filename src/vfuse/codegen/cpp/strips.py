"""Long-row reductions as strips: one SIMD lane loop around several accumulator chains.

A `#pragma omp simd reduction(+:acc)` loop keeps one vector accumulator, so a 1024-wide
fp32 row is a chain of 64 dependent vector adds (or FMAs, or max) of ~4 cycles each, and
g++ ends each such loop with a horizontal sum of 15 dependent scalar adds. Here the block
[rb, re) is walked by an outer SIMD loop over the VECTOR lanes of one vector; each lane runs
CHAINS scalar accumulators over the block in steps of CHAINS * VECTOR elements, chain s
taking element j + s * VECTOR + lane. g++ vectorizes the lane loop (outer-loop
vectorization): every chain is one vector register, the loads of one step are contiguous
and in order (one sequential stream per row), and the chains are folded pairwise. The lanes
are stored to a VECTOR-long array and folded by halving (vector adds, a few shuffles)
instead of g++'s serial horizontal sum. Elements past the last whole step go through a
plain SIMD loop into the block's accumulator. Sums stay blocked by BLOCK elements
(render.py); only their order inside a block changes.

A first pass waits on memory, so it takes several chains only where the kernel prefetches its
rows (`prefetch.py`); without, the faster loop only piles up demand misses. Bodies with other
than CHEAP ops are bound by their own instructions: one chain each, which still saves the
serial horizontal sum. Measurements: docs/perf-log.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfuse.codegen.cpp.lanes import fold_halving
from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.ir import DType, Op
from vfuse.schedule.kernel import Compute, Kernel, Loop, Pass, Reduce

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

VECTOR = 16  # fp32 elements per AVX-512 vector: the lane loop's trip count
CHAINS = 8  # for a row already in L1: 4-cycle FMA latency at two per cycle
FIRST_CHAINS = 4  # for a first pass over prefetched rows (8 gained nothing more)
# A few instructions per element, so the accumulator chain is what a pass waits on.
CHEAP = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.ABS, Op.MAXIMUM, Op.MINIMUM, Op.CAST, Op.WHERE})
# Inline arithmetic in the prelude: g++ vectorizes the lane loop around them. A libm/libmvec
# call (log, tanh, ...) in the chain loop stops outer-loop vectorization ("no vectype"), which
# would leave the whole pass scalar.
INLINE = CHEAP | {Op.EXP, Op.DIV, Op.SQRT, Op.RSQRT, Op.SIGMOID, Op.SILU}
FLOAT_ACC = frozenset({DType.F32, DType.F16, DType.BF16})  # accumulated in float


def strip_chains(k: Kernel, p: Pass, vec: Loop, length: int | None, parallel: bool, prefetched: bool) -> int:
    """Accumulator chains per lane for pass `p` over blocks of `length` elements of `vec`
    (None: blocks differ), 0 for no strips: float sums and products of INLINE ops, blocks of
    one constant length of at least two vectors, not split between threads; a first pass
    only over prefetched rows. g++ vectorizes the lane loop only around a chain loop of
    constant trip count (a guard on it is "control flow in loop")."""
    if parallel or length is None or length < 2 * VECTOR:
        return 0
    ops = {s.op for s in p.body if isinstance(s, Compute)}
    if not ops <= INLINE or any(s.dtype is DType.F64 for s in p.body if isinstance(s, Compute)):
        return 0  # double math goes through libm
    if any(r.op not in (Op.SUM, Op.PROD) or r.dtype not in FLOAT_ACC for r in p.reduces):
        # Max/min track NaN in a flag: a second, independent chain that g++ splits off (not
        # vectorized: "two or more consecutive inner loops"), also when NaN rides in the value.
        return 0
    first = p is k.passes[0]
    if first and not prefetched:
        return 0
    chains = FIRST_CHAINS if first else CHAINS
    if not ops <= CHEAP:
        chains = 1
    while chains > 1 and length < 2 * chains * VECTOR:
        chains //= 2
    return chains


def render_strips(w: KernelWriter, p: Pass, vec: Loop, chains: int, length: int) -> None:
    """Reduce block [rb, rb + length) of `vec` into `<var>_blk` (declared by the caller)."""
    step = chains * VECTOR
    for r in p.reduces:
        w.w(f"{w.acc_type(r)} {r.var}_sp[{VECTOR}];")
    w.w("#pragma omp simd")
    w.w(f"for (int64_t sl = 0; sl < {VECTOR}; ++sl) {{")
    w.depth += 1
    _lane(w, p, vec, chains, length // step * step)
    w.close()
    fold_halving(w, p.reduces, "_sp", VECTOR)
    if length % step:
        w.w(f"#pragma omp simd {w.clauses(p.reduces, '_blk')}")
        w.open_loop(vec, f"rb + {length // step * step}", "re")
        w.body(p, "_blk")
        w.close()
    for r in p.reduces:
        _combine(w, r, "_blk", "_sp[0]")


def _lane(w: KernelWriter, p: Pass, vec: Loop, chains: int, span: int) -> None:
    """One lane's chains over the first `span` elements of the block, folded pairwise into
    its slot of `_sp`."""
    i = w.names[vec.var]
    for r in p.reduces:
        for s in range(chains):
            w.declare_acc(r, f"{r.var}_q{s}")
    w.w(f"for (int64_t sj = 0; sj < {span}; sj += {chains * VECTOR}) {{")
    w.depth += 1
    for s in range(chains):
        # One scope per chain: the body's statements keep their names in each copy.
        w.w("{")
        w.depth += 1
        w.w(f"const int64_t {i} = rb + sj + {s * VECTOR} + sl;")
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
