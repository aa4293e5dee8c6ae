"""A short row held in registers across its passes (`Kernel.register_row`, decided by
`strategy.register_row`): one row at a time, each row vector a GCC vector-extension value of
`register_row` fp32 lanes, named per vector (`t1_0`, `t1_1`, ...). A row is loaded once; a value a
later pass computes again (LayerNorm's x - mean in the normalize pass) is the earlier one. The
statements of the row-by-row kernel are kept one for one, so every row's arithmetic, and so its
rounding, is that kernel's: sums in the pass's lanes (`Reduction.lanes`) as chains of whole
vectors (vector j into chain j % chains), folded as `lanes.fold_halving` folds them; the affine
step's fma (`Pass.muladds`) element by element through `vf_fmaf`.
"""

from __future__ import annotations

from vfuse.codegen.cpp.lanes import fold_halving
from vfuse.codegen.cpp.prefetch import render_prefetch
from vfuse.codegen.cpp.rows import row_region
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir import Op
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.kernel import Accumulate, Compute, Load, Pass, Store

_OPERATORS = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*"}


def render_register_rows(w: KernelWriter) -> None:
    row_region(w, _rows)


def _rows(w: KernelWriter) -> None:
    (lp,) = w.k.outer
    (vec,) = w.k.inner
    lanes = w.k.register_row
    count = vec.size // lanes
    w.open_loop(lp)
    # Values (one register each) and their unaligned memory form (as simd.vs_loadu), local to the kernel.
    w.w(f"typedef float vr_t __attribute__((vector_size({4 * lanes})));")
    w.w(f"typedef float vr_u __attribute__((vector_size({4 * lanes}), aligned(4), may_alias));")
    vectors: set[str] = set()
    for i, p in enumerate(w.k.passes):
        if w.k.prefetch:  # each pass's share of the row `distance` ahead (`plan_group_prefetch`)
            render_prefetch(w, w.k.prefetch, i)
        for s in p.before:
            w.stmt(s)
        _body(w, p, vectors, count)
        _sums(w, p, count)
        for r in p.reduces:
            w.w(f"const float {r.var}_acc = {r.var}_ln[0];")
            w.finish(r)
    for s in w.k.after:
        w.stmt(s)
    w.close()


def _body(w: KernelWriter, p: Pass, vectors: set[str], count: int) -> None:
    """`p`'s per-element statements: row scalars once, then the rest vector by vector (each vector's
    statements together, as the row-by-row loop's body: g++ kept that order, and issued the normalize
    pass's 16 multiplies ahead of its loads and fmas when they came statement by statement)."""
    v = Var(w.k.inner[0].var)
    made: list[Load | Compute | Store] = []
    for s in p.body:
        if isinstance(s, Store):
            made.append(s)
        elif s.var in vectors:
            continue  # made by an earlier pass: the same value, still in its registers
        elif (isinstance(s, Load) and s.index.coef(v)) or (
            isinstance(s, Compute) and any(a in vectors for a in s.args)
        ):
            made.append(s)
            w.dtypes[s.var] = s.dtype
            vectors.add(s.var)
        else:
            w.stmt(s)  # a row scalar
    fmas = {var: (a, b, c) for var, a, b, c in p.muladds}
    for j in range(count):
        for s in made:
            _vector(w, s, fmas, vectors, j)


def _vector(
    w: KernelWriter, s: Load | Compute | Store, fmas: dict[str, tuple[str, str, str]], vectors: set[str], j: int
) -> None:
    """Statement `s` at row vector `j`."""
    lanes = w.k.register_row
    if isinstance(s, Store):
        val = f"{s.arg}_{j}" if s.arg in vectors else f"({s.arg} - vr_t{{}})"
        w.w(f"*(vr_u*)&{pointer(s.buf)}[{_at(w, s.index, j * lanes)}] = {val};")
    elif isinstance(s, Load):
        w.w(f"const vr_t {s.var}_{j} = *(const vr_u*)&{pointer(s.buf)}[{_at(w, s.index, j * lanes)}];")
    else:
        _compute(w, s, fmas.get(s.var), vectors, j, lanes)


def _compute(
    w: KernelWriter, s: Compute, fma: tuple[str, str, str] | None, vectors: set[str], j: int, lanes: int
) -> None:
    if fma is None:
        a, b = (f"{x}_{j}" if x in vectors else x for x in s.args)
        w.w(f"const vr_t {s.var}_{j} = ({a} {_OPERATORS[s.op]} {b});")
        return
    a, b, c = (f"{x}_{j}[e]" if x in vectors else x for x in fma)
    w.w(f"vr_t {s.var}_{j};")
    w.w(f"for (int e = 0; e < {lanes}; ++e) {s.var}_{j}[e] = vf_fmaf({a}, {b}, {c});")


def _sums(w: KernelWriter, p: Pass, count: int) -> None:
    """Each sum of `p` into `<var>_ln[0]`: chains of whole vectors (the pass's lanes, else one), halved
    into one vector, then `fold_halving` over its lanes."""
    lanes = w.k.register_row
    chains = p.reduction.lanes // lanes if p.reduction.kind is Accumulate.LANES else 1
    for r in p.reduces:
        n = max(1, min(chains, count))
        # Each chain starts at its first vector, not at 0 + it: from zeros, g++ folded the row's loads
        # into the adds and loaded the row again in the next pass (only a -0 sum's sign differs).
        for c in range(n):
            w.w(f"vr_t {r.var}_c{c} = {r.arg}_{c};")
        for j in range(n, count):
            w.w(f"{r.var}_c{j % n} += {r.arg}_{j};")
        while n > 1:  # as fold_halving's first steps over the chains' lanes
            n //= 2
            for c in range(n):
                w.w(f"{r.var}_c{c} += {r.var}_c{c + n};")
        w.w(f"float {r.var}_ln[{lanes}];")
        w.w(f"*(vr_u*){r.var}_ln = {r.var}_c0;")
    fold_halving(w, p.reduces, "_ln", lanes)


def _at(w: KernelWriter, index: Lin, j: int) -> str:
    """The index rendered at the inner loop's element `j`."""
    v = w.k.inner[0].var
    saved = w.names[v]
    w.names[v] = f"{j}"
    try:
        return w.idx(index)
    finally:
        w.names[v] = saved
