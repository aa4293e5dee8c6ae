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
(`schedule/strategy.py`). An fp32 sum of a product used nowhere else (LayerNorm's variance, RMSNorm's
sum of squares) accumulates with one fma per element instead of a multiply and an add.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from vfuse.codegen.cpp.lanes import fold_halving
from vfuse.codegen.cpp.rules import REDUCE_RULES
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.ir import DType, Op
from vfuse.schedule.kernel import Compute, Loop, Pass, Reduce, Select, Store


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
        _body(w, p, "_blk")
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
        _body(w, p, f"_q{s}")
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


def _body(w: KernelWriter, p: Pass, suffix: str) -> None:
    """The pass's body and its accumulators' updates, a summed product as acc = fma(a, b, acc):
    one FMA-pipe operation per element instead of a multiply and an add (Zen 3 AVX2: the
    LayerNorm row's variance pass, docs/perf-log.md). It rounds once where a * b + acc rounded
    twice; the product's own statement is left to g++ to drop."""
    products = _summed_products(p) if w.range is None else {}
    w.body(replace(p, reduces=tuple(r for r in p.reduces if r.var not in products)), suffix)
    for r in p.reduces:
        if r.var in products:
            acc = f"{r.var}{suffix}"
            w.w(f"{acc} = vf_fmaf({products[r.var][0]}, {products[r.var][1]}, {acc});")


def _summed_products(p: Pass) -> dict[str, tuple[str, ...]]:
    """fp32 sums whose element is an fp32 product read by nothing else: reduce var -> factors."""
    uses = Counter(a for s in p.body if isinstance(s, Compute | Select) for a in s.args)
    uses.update([s.arg for s in p.body if isinstance(s, Store)] + [r.arg for r in p.reduces] + list(p.buffered))
    muls = {s.var: s.args for s in p.body if isinstance(s, Compute) and s.op is Op.MUL and s.dtype is DType.F32}
    return {
        r.var: muls[r.arg]
        for r in p.reduces
        if r.op is Op.SUM and r.dtype is DType.F32 and r.arg_dtype is DType.F32 and r.arg in muls and uses[r.arg] == 1
    }


def _combine(w: KernelWriter, r: Reduce, into: str, part: str) -> None:
    w.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}{into}", part=f"{r.var}{part}"))
