"""Peeling a pointwise SIMD loop around the borders of a window (`Pass.peel`).

A pooling window's taps read `x[clamp(s * v + k, 0, n - 1)]` (the clamp keeps a tap outside the
image in bounds; a select then drops its value). g++ turns such loads into gathers at best and
often not at all: a 3x3 stride-2 max-pool with BatchNorm and ReLU fused in ran scalar (1.5 ms
for 2x64x32x32, eager 1.0 ms). Where every clamp in the SIMD loop's load indices depends on that
loop alone, the loop is split into a border, an interior where no clamp is active (so its loads
are plain strided ones, which vectorize), and the other border; only the interior is rendered
without the clamps (`expr.unclamp`).
"""

from __future__ import annotations

from vfuse.schedule.expr import Clamp, Var, var_ids, walk
from vfuse.schedule.kernel import Kernel, Load, Loop, Pass


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
