"""Peeling a pointwise SIMD loop around the borders of a window (`Pass.peel`).

A pooling window's taps read `x[clamp(s * v + k, 0, n - 1)]` (the clamp keeps a tap outside the
image in bounds; a select then drops its value). g++ turns such loads into gathers at best and
often not at all: a 3x3 stride-2 max-pool with BatchNorm and ReLU fused in ran scalar (1.5 ms
for 2x64x32x32, eager 1.0 ms). Where every clamp in the SIMD loop's load indices depends on that
loop alone, the loop is split into a border, an interior where no clamp is active (so its loads
are plain strided ones, which vectorize), and the other border; only the interior is rendered
without the clamps (`expr.unclamp`).

A concatenation along the SIMD loop's dim is a select between its inputs, each read at a clamped
index (lower.py's `_cat`): every element loads every piece. GPT-2's backward stores dq, dk, dv
side by side (their cat along the last dim, each read through a head permute): 3 gathers and 2
selects per element, 0.55 ms for 256 x 768 where a copy takes 0.03. `ranges` splits the SIMD
loop where the selects switch (and where clamps start or stop being active): in each range
one input is read, unclamped, the others not at all; where the piece's index divides the loop
var (a head's columns), the range runs in blocks of the divisor so the inner loop is a plain
contiguous copy (`Range.block`; 256 x 768: 450 -> 26 us on Zen 3, one thread).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from vfuse.schedule.expr import Clamp, Div, Lin, Mod, Var, dyn_names, var_ids, walk, within
from vfuse.schedule.kernel import Kernel, Load, Loop, Pass, Range, Select, Stmt, Store, stmt_args, stmt_index

MAX_RANGES = 32  # more pieces than this (a cat of many thin tensors): the select loop is kept
MIN_BLOCK = 8  # a block shorter than a vector of 8 lanes would not pay for its loop


def _clamps(p: Pass) -> list[Clamp]:
    loads = [s for s in p.body if isinstance(s, Load)]
    return [a for s in loads for lin in walk(s.index) for a, _ in lin.terms if isinstance(a, Clamp)]


def _range(c: Clamp, var: Var) -> tuple[int, int] | None:
    """[lo, hi): the values of `var` where clamp `c` of `coef * var + const` is inactive."""
    coef, k = c.arg.coef(var), c.arg.const
    if not all(isinstance(x, int) for x in (coef, k, c.lo, c.hi)) or coef == 0:
        return None
    if coef > 0:  # c.lo <= coef * v + k <= c.hi
        return -((k - c.lo) // coef), (c.hi - k) // coef + 1
    return -((c.hi - k) // -coef), (k - c.lo) // -coef + 1


def interior(p: Pass, vec: Loop) -> tuple[int, int] | None:
    """The SIMD loop's range without an active clamp, when peeling is possible and useful: every
    clamp on the loop's variable is of it alone (no other loop in it), and the sizes are known."""
    var = Var(vec.var)
    on_vec = [c for c in _clamps(p) if c.arg.coef(var)]
    if not on_vec or not isinstance(vec.size, int):
        return None
    lo, hi = 0, vec.size
    for c in on_vec:
        if any(a != var for a, _ in c.arg.terms) or (r := _range(c, var)) is None:
            return None
        lo, hi = max(lo, r[0]), min(hi, r[1])
    return (lo, hi) if lo < hi else None


def threaded_selects(k: Kernel) -> bool:
    """Whether the kernel loads at indices clamped along an outer loop (a window's rows, padding,
    a concatenation along an outer dim): their selects are invariant in the SIMD loop, and g++'s
    jump threading splits the body on them, leaving the loads conditional (masked strided loads it
    does not vectorize): 3x3 max- and avg-pools ran scalar at stride 1 and 2, 3-13x slower
    (`Kernel.no_jump_threading`). Clamps of the SIMD loop's variable alone (a concatenation along
    the last dim) keep it: that kernel ran 1.3x slower without."""
    loops = (*k.outer, *k.inner)
    if not loops:
        return False
    simd = {lp.var for lp in loops if lp.vector} or {loops[-1].var}
    stmts = [*k.after, *(s for p in k.passes for s in (*p.before, *p.body))]
    atoms = [a for s in stmts if isinstance(s, Load) for lin in walk(s.index) for a, _ in lin.terms]
    return any(isinstance(a, Clamp) and var_ids(a.arg) - simd for a in atoms)


def with_ranges(k: Kernel) -> Kernel:
    """`k` with the SIMD loop of each plain pointwise pass split at its CAT's pieces (`ranges`)
    where it has no window peel: a padded window's selects (a CAT with the pad value) keep the
    peel measured for pools, whose interior already reads one piece. A residue split
    (`residue.py`) already splits its loop at the pieces."""
    passes = []
    for p in k.passes:
        found = () if p.peel is not None or p.residue is not None else ranges(k, p)
        passes.append(dataclasses.replace(p, ranges=found) if found else p)
    return dataclasses.replace(k, passes=tuple(passes)) if passes != list(k.passes) else k


def ranges(k: Kernel, p: Pass) -> tuple[Range, ...]:
    """The ranges of the SIMD loop (the last inner loop) in which every select along it alone
    takes one input; () where there is no such select, or the pass accumulates, buffers rows,
    streams, or splits that loop between threads."""
    if not k.inner or p.reduces or p.buffered or p.reloaded or p.streamed:
        return ()
    vec = k.inner[-1]
    v = Var(vec.var)
    if not isinstance(vec.size, int) or (vec.parallel and not p.serial):
        return ()
    selects = [s for s in p.body if isinstance(s, Select) and _slope(s.coord, v)]
    if any(not isinstance(b, int) for s in selects for b in s.bounds):  # symbolic sizes: not split
        return ()
    if not selects:
        return ()
    cuts = {0, vec.size}
    for s in selects:
        cuts |= {-((s.coord.const - b) // s.coord.coef(v)) for b in s.bounds}
    for c in _clamps(p):
        if (r := _range(c, v)) is not None and r[0] < r[1] and all(a == v for a, _ in c.arg.terms):
            cuts |= set(r)
    edges = sorted(x for x in cuts if 0 <= x <= vec.size)
    if len(edges) - 1 > MAX_RANGES:
        return ()
    free = 1 + max(lp.var for lp in (*k.outer, *k.inner))  # the block loop's var id
    return tuple(_one(p, v, lo, hi, free) for lo, hi in itertools.pairwise(edges) if lo < hi)


def _slope(coord: Lin, v: Var) -> bool:
    """The select's coordinate is c * v + const with c > 0 (the CAT's dim is the SIMD loop's)."""
    one = len(coord.terms) == 1 and coord.terms[0][0] == v and isinstance(coord.terms[0][1], int)
    return one and isinstance(coord.const, int) and coord.coef(v) > 0


def _pick(s: Select, v: Var, x: int) -> int:
    """The input the select takes at v = x."""
    value = s.coord.const + s.coord.coef(v) * x
    return next((i for i, b in enumerate(s.bounds) if value < b), len(s.bounds))


def _one(p: Pass, v: Var, lo: int, hi: int, block_var: int) -> Range:
    picks = {s.var: _pick(s, v, lo) for s in p.body if isinstance(s, Select) and _slope(s.coord, v)}
    live = _live(p.body, picks)
    rng = Range(lo, hi, tuple(sorted(picks.items())), tuple(s.var for s in p.body if _var(s) not in live))
    block = _block(p.body, live, v, lo, hi, block_var)
    return dataclasses.replace(rng, block=block, block_var=block_var) if block else rng


def _var(s: Stmt | Store) -> str | None:
    return None if isinstance(s, Store) else s.var


def _live(body: tuple[Stmt | Store, ...], picks: dict[str, int]) -> set[str | None]:
    """The values the range's stores need, each select reading only its picked input."""
    need: set[str | None] = {None}  # stores
    for s in reversed(body):
        if _var(s) not in need:
            continue
        if isinstance(s, Store):
            args: tuple[str, ...] = (s.arg,)
        elif isinstance(s, Select) and s.var in picks:
            args = (s.args[picks[s.var]],)
        else:
            args = stmt_args(s)
        need |= set(args) | {n for e in stmt_index(s) for n in dyn_names(e)}
    return need


def _block(body: tuple[Stmt | Store, ...], live: set[str | None], v: Var, lo: int, hi: int, block_var: int) -> int:
    """The block that leaves no div / mod of the SIMD var in the live indices (each piece's loads
    contiguous within a block), or 0 (none needed, or none possible)."""
    indices = [within(e, v.id, lo, hi) for s in body if _var(s) in live for e in stmt_index(s)]
    on_v = [a for e in indices for lin in walk(e) for a, _ in lin.terms if _on(a, v)]
    if any(isinstance(a, Clamp) for a in on_v):
        return 0  # a clamp active inside the range (a pool's padding): no block makes it contiguous
    divisors = [a.divisor for a in on_v if isinstance(a, Div | Mod)]
    if not divisors or not all(isinstance(d, int) for d in divisors):
        return 0
    block = math.gcd(*divisors)
    if block < MIN_BLOCK or (hi - lo) % block:
        return 0
    blocked = [within(e, v.id, lo, hi, block, block_var) for e in indices]
    return 0 if any(_on(a, v) for e in blocked for lin in walk(e) for a, _ in lin.terms) else block


def _on(a: object, v: Var) -> bool:
    """A div, mod or clamp of a form in the SIMD var (what keeps a load from being contiguous)."""
    return isinstance(a, Div | Mod | Clamp) and v.id in var_ids(a.arg)
