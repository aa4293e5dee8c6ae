"""The residue split of a SIMD loop (`Pass.residue`): v = s * q + b, b unrolled, q vectorized.

A strided conv's data gradient interleaves its stride phases (`frontend/conv_dgrad_gemm.py`: a
CAT of per-phase sums, then a RESHAPE merging the CAT's axis into the output's last axis). The
kernel's SIMD loop over that output column v indexes every load below the CAT by `v / s` and picks
the phase by `v % s`: every load a gather, every phase's taps loaded and selected at every point
(3x3 s2 col2im 8x32x28x28 -> 64, one thread on Zen 3: 0.77 ms). With v = s * q + b and the s values
of b rendered one after another in the loop over q, each copy's `% s` and `/ s` fold (b is a
constant): its selects pick one phase, its loads are contiguous in q, and its store has stride s,
which g++ vectorizes with the other copies' as one interleaved store group (a hand-split copy of
that kernel: 0.25 ms, same bits). The loop over q is split further where selects and clamps along
q switch, as `peel.ranges` does for a CAT along the SIMD loop (a phase's zero-padded edge).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from vfuse.fusion.gathers import MAX_RESIDUE
from vfuse.schedule.expr import Div, Lin, Mod, Var, substitute, var_ids, walk
from vfuse.schedule.kernel import Kernel, Loop, Pass, Range, Residue, Select, Stmt, Store, Walk
from vfuse.schedule.peel import MAX_RANGES, _clamps, _live, _range, _slope, _var

SPLIT_WALKS = (Walk.SINGLE_ROW, Walk.ROWS)


def residue(k: Kernel, p: Pass) -> Residue | None:
    """The split of `p`'s SIMD loop (the kernel's last inner loop) where its variable enters a
    select through div / mod by a constant and every such div / mod folds once v = s * q + b
    (2 <= s <= MAX_RESIDUE); None where it does not apply: the pass accumulates, buffers rows,
    streams, has a window peel, or its SIMD loop is split between threads or has a symbolic size."""
    if k.walk not in SPLIT_WALKS or not k.inner or p.reduces or p.buffered or p.reloaded or p.streamed:
        return None
    vec = k.inner[-1]
    if p.peel is not None or not isinstance(vec.size, int) or (vec.parallel and not p.serial):
        return None
    s = _stride(p, vec.var)
    if s is None or vec.size < s:
        return None
    loops = (*k.outer, *k.inner)
    qvar, rvar = 1 + max(lp.var for lp in loops), 2 + max(lp.var for lp in loops)
    sizes = {lp.var: lp.size for lp in loops} | {qvar: vec.size // s}
    forms = [(vec.var, Lin.var(Var(qvar)) * s + b) for b in range(s)]
    bodies = tuple(_body(p.body, [f], sizes) for f in forms)
    if any(_gathers(e, qvar) for body in bodies for st in body for e in _indices(st)):
        return None
    row = _row_split(p, loops, sizes, rvar)
    if row is not None:
        arms = [[(row[0], Lin.var(Var(rvar)) * row[1] + a), f] for a in range(row[1]) for f in forms]
        both = tuple(_body(p.body, subs, sizes) for subs in arms)
        folded = not any(_gathers(e, rvar) or _gathers(e, qvar) for body in both for st in body for e in _indices(st))
        bodies, row = (both, row) if folded else (bodies, None)
    pieces = _pieces(p, bodies, qvar, vec.size // s)
    if pieces is None:
        return None
    split = Residue(vec.var, s, qvar, vec.size // s, bodies, pieces)
    return dataclasses.replace(split, row=row[0], row_stride=row[1], rvar=rvar) if row else split


def _row_split(p: Pass, loops: tuple[Loop, ...], sizes: dict[int, int], rvar: int) -> tuple[int, int] | None:
    """(r, s_r): the loop enclosing the SIMD loop, when its phase r % s_r selects too (a 2-D
    interleave's rows); `sizes` gets the row quotient's extent."""
    if len(loops) < 2 or not isinstance(loops[-2].size, int):
        return None
    r = loops[-2].var
    s_r = _stride(p, r)
    if s_r is None:
        return None
    sizes[rvar] = -(-loops[-2].size // s_r)
    return r, s_r


Body = tuple[Stmt | Store, ...]


def _body(body: Body, subs: list[tuple[int, Lin]], sizes: dict[int, int]) -> Body:
    out = []
    for st in body:
        for var, form in subs:
            st = _rewrite(st, var, form, sizes)
        out.append(st)
    return tuple(out)


def _stride(p: Pass, var: int) -> int | None:
    """The least s folding every div / mod of the SIMD var (d / gcd(d, coefficient) for each),
    when a select's coordinate has one (an interleave) and s is small enough to unroll."""
    v = Var(var)
    atoms = [a for st in p.body for e in _indices(st) for lin in walk(e) for a, _ in lin.terms]
    on_v = [a for a in atoms if isinstance(a, Div | Mod) and var in var_ids(a.arg)]
    if not on_v or any(not isinstance(a.divisor, int) or not isinstance(a.arg.coef(v), int) for a in on_v):
        return None
    if not any(_gathers(st.coord, var) for st in p.body if isinstance(st, Select)):
        return None
    s = math.lcm(*(a.divisor // math.gcd(a.divisor, a.arg.coef(v)) for a in on_v))
    return s if 2 <= s <= MAX_RESIDUE else None


def _indices(st: Stmt | Store) -> tuple[Lin, ...]:
    index = getattr(st, "index", None)
    if isinstance(st, Select):
        return (st.coord,)
    return (index,) if isinstance(index, Lin) else ()


def _rewrite(st: Stmt | Store, var: int, form: Lin, sizes: dict[int, int]) -> Stmt | Store:
    if isinstance(st, Select):
        return dataclasses.replace(st, coord=substitute(st.coord, var, form, sizes))
    index = getattr(st, "index", None)
    if isinstance(index, Lin):
        return dataclasses.replace(st, index=substitute(index, var, form, sizes))  # type: ignore[type-var]
    return st


def _gathers(e: Lin, var: int) -> bool:
    """A div or mod of loop `var` in `e` (a load at it gathers; a select on it is a phase's)."""
    return any(isinstance(a, Div | Mod) and var in var_ids(a.arg) for lin in walk(e) for a, _ in lin.terms)


def _pieces(
    p: Pass, bodies: tuple[tuple[Stmt | Store, ...], ...], qvar: int, groups: int
) -> tuple[tuple[Range, ...], ...] | None:
    """Per range of q where every copy's selects along q take one input, each copy's Range."""
    q = Var(qvar)
    cuts = {0, groups}
    for body in bodies:
        for st in body:
            if isinstance(st, Select) and _slope(st.coord, q):
                if any(not isinstance(b, int) for b in st.bounds):
                    return None
                cuts |= {-((st.coord.const - b) // st.coord.coef(q)) for b in st.bounds}
        for c in _clamps(dataclasses.replace(p, body=body)):
            if (r := _range(c, q)) is not None and r[0] < r[1] and all(a == q for a, _ in c.arg.terms):
                cuts |= set(r)
    edges = sorted(x for x in cuts if 0 <= x <= groups)
    if len(edges) - 1 > MAX_RANGES:
        return None
    return tuple(tuple(_copy(b, q, lo, hi) for b in bodies) for lo, hi in itertools.pairwise(edges) if lo < hi)


def _copy(body: tuple[Stmt | Store, ...], q: Var, lo: int, hi: int) -> Range:
    """One copy's Range over q in [lo, hi): each select whose coordinate is constant (the phase,
    b's) or along q alone picks its input; values only the other inputs need are dead."""
    picks = {st.var: _pick(st, q, lo) for st in body if isinstance(st, Select) and _fixed(st, q)}
    live = _live(body, picks)
    return Range(lo, hi, tuple(sorted(picks.items())), tuple(st.var for st in body if _var(st) not in live))


def _fixed(st: Select, q: Var) -> bool:
    const = st.coord.is_const and isinstance(st.coord.const, int)
    return (const or _slope(st.coord, q)) and all(isinstance(b, int) for b in st.bounds)


def _pick(st: Select, q: Var, x: int) -> int:
    value = st.coord.const + st.coord.coef(q) * x
    return next((i for i, b in enumerate(st.bounds) if value < b), len(st.bounds))


def with_residues(k: Kernel) -> Kernel:
    """`k` with the SIMD loop of each pass that interleaves phases residue-split (`residue`)."""
    passes = tuple(dataclasses.replace(p, residue=r) if (r := residue(k, p)) else p for p in k.passes)
    return dataclasses.replace(k, passes=passes) if passes != k.passes else k
