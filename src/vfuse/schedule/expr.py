"""Index expressions of loop nests: linear forms over loop variables with a few non-linear atoms.

Every buffer offset, RAND counter and CAT selector of a kernel is a `Lin`: a constant plus
integer multiples of atoms. Atoms are loop variables, floor-divisions, modulos and clamps of
inner `Lin`s, and `Dyn` (an index loaded at run time, e.g. an embedding row). Keeping offsets
linear is what makes the code generator's inner loops contiguous (coefficient 1), broadcast
(0) or strided, and what lets adjacent loops be merged into one (`merge_vars`).
Simplification uses each variable's range, so a reshape that splits or merges contiguous dims
folds back to a linear form instead of leaving div/mod in the inner loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from vfuse.ir.sym import known_multiple, proved

INF = 1 << 62


@dataclass(frozen=True, slots=True)
class Var:
    """A loop variable; its extent lives in the loop nest (`sizes` maps id -> extent)."""

    id: int


@dataclass(frozen=True, slots=True)
class Div:
    arg: Lin
    divisor: int


@dataclass(frozen=True, slots=True)
class Mod:
    arg: Lin
    divisor: int


@dataclass(frozen=True, slots=True)
class Clamp:
    arg: Lin
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Dyn:
    """An integer computed by the kernel at run time (the C++ variable `name`)."""

    name: str


Atom = Var | Div | Mod | Clamp | Dyn


@dataclass(frozen=True, slots=True)
class Lin:
    """const + sum(coef * atom); terms sorted by repr so equal forms compare equal."""

    const: int = 0
    terms: tuple[tuple[Atom, int], ...] = ()

    @staticmethod
    def var(v: Var) -> Lin:
        return Lin(0, ((v, 1),))

    @staticmethod
    def of(const: int) -> Lin:
        return Lin(const)

    def coef(self, atom: Atom) -> int:
        return next((c for a, c in self.terms if a == atom), 0)

    def __add__(self, other: Lin | int) -> Lin:
        o = other if isinstance(other, Lin) else Lin(other)
        acc: dict[Atom, int] = dict(self.terms)
        for a, c in o.terms:
            acc[a] = acc.get(a, 0) + c
        return _make(self.const + o.const, acc)

    def __mul__(self, k: int) -> Lin:
        return _make(self.const * k, {a: c * k for a, c in self.terms})

    def __sub__(self, other: Lin | int) -> Lin:
        o = other if isinstance(other, Lin) else Lin(other)
        return self + o * -1

    @property
    def is_const(self) -> bool:
        return not self.terms


# Symbolic sizes (ir/sym.py) as coefficients and divisors: each simplification below takes its
# "yes" only where it is proved for every size (`proved`, `known_multiple`) and otherwise keeps
# the general form (a zero term kept, a Div/Mod atom left), which is right at any size: the
# simplifier never takes a guard.
def _nonzero(c: int) -> bool:
    return not proved(c, "==", 0)


def _make(const: int, acc: Mapping[Atom, int]) -> Lin:
    terms = {a: c for a, c in acc.items() if _nonzero(c)}
    for m in [a for a in terms if isinstance(a, Mod)]:
        # d * (x // d) + x % d == x: a reshape that splits a dim and merges it back (GroupNorm's
        # [N, C, H, W] read as [N, G, C/G, H*W]) is then linear again, and its loops can merge.
        c, div = terms.get(m, 0), Div(m.arg, m.divisor)
        if _nonzero(c) and div in terms and proved(terms[div], "==", c * m.divisor):
            del terms[m], terms[div]
            const += c * m.arg.const
            for a, k in m.arg.terms:
                terms[a] = terms.get(a, 0) + c * k
    return Lin(const, tuple(sorted(((a, c) for a, c in terms.items() if _nonzero(c)), key=lambda t: repr(t[0]))))


def span(e: Lin, sizes: Mapping[int, int]) -> tuple[int, int]:
    """Inclusive [lo, hi] of `e` over the loop ranges (INF-wide where a Dyn makes it unknown)."""
    lo = hi = e.const
    for a, c in e.terms:
        alo, ahi = _atom_span(a, sizes)
        if proved(0, "<=", c):
            lo, hi = lo + c * alo, hi + c * ahi
        elif proved(c, "<=", 0):
            lo, hi = lo + c * ahi, hi + c * alo
        else:
            return -INF, INF
    # Symbolic bounds (ir/sym.py) stay as they are: clamping them would only take a guard.
    return (lo if not isinstance(lo, int) else max(lo, -INF)), (hi if not isinstance(hi, int) else min(hi, INF))


def _atom_span(a: Atom, sizes: Mapping[int, int]) -> tuple[int, int]:
    if isinstance(a, Var):
        n = sizes[a.id]
        return 0, (max(n - 1, 0) if isinstance(n, int) else n - 1)  # a symbolic loop of 0 runs no body
    if isinstance(a, Div):
        lo, hi = span(a.arg, sizes)
        return lo // a.divisor, hi // a.divisor
    if isinstance(a, Mod):
        return 0, a.divisor - 1
    if isinstance(a, Clamp):
        return a.lo, a.hi
    return -INF, INF


def floordiv(e: Lin, d: int, sizes: Mapping[int, int]) -> Lin:
    """e // d, folded to a linear form when the remainder part provably stays in [0, d)."""
    if proved(d, "==", 1):
        return e
    whole = {a: c // d for a, c in e.terms if known_multiple(c, d)}
    rest = _make(e.const % d, {a: c for a, c in e.terms if not known_multiple(c, d)})
    lo, hi = span(rest, sizes)
    if proved(0, "<=", lo) and proved(hi, "<", d):
        return _make(e.const // d, whole)
    if proved(0, "<=", lo) and (whole or proved(d, "<=", e.const)):
        # e = d * w + r with r >= 0: e // d = w + r // d (only for r >= 0: C++ truncates)
        return _make(e.const // d, whole) + floordiv(rest, d, sizes)
    one_div = len(e.terms) == 1 and isinstance(e.terms[0][0], Div) and proved(e.terms[0][1], "==", 1)
    if one_div and proved(e.const, "==", 0):
        inner = e.terms[0][0]
        return floordiv(inner.arg, inner.divisor * d, sizes)
    split = _split_small(e, d, sizes)
    if split is not None:  # e = g*h + r with 0 <= r < g and g | d: e // d = h // (d/g)
        g, high, _ = split
        return floordiv(high, d // g, sizes)
    return Lin(0, ((Div(e, d), 1),))


def _split_small(e: Lin, d: int, sizes: Mapping[int, int]) -> tuple[int, Lin, Lin] | None:
    """(g, h, r) with e = g*h + r, g > 1 dividing d and r provably in [0, g), if one exists.

    This is what folds (8*i + j) // 16 with j < 8 into i // 2 when a dim is split.
    """
    if not isinstance(d, int) or not all(isinstance(c, int) for _, c in e.terms) or not isinstance(e.const, int):
        return None  # symbolic sizes (ir/sym.py) have no gcd
    for g in sorted({math.gcd(d, c) for _, c in e.terms} | {math.gcd(d, e.const)}, reverse=True):
        if g in (1, d):
            continue
        high = _make(e.const - e.const % g, {a: c for a, c in e.terms if c % g == 0})
        low = _make(e.const % g, {a: c for a, c in e.terms if c % g})
        lo, hi = span(low, sizes)
        if 0 <= lo and hi < g:
            return g, _make(high.const // g, {a: c // g for a, c in high.terms}), low
    return None


def mod(e: Lin, d: int, sizes: Mapping[int, int]) -> Lin:
    """e % d (e >= 0 as every index is), folded when the kept part stays in [0, d)."""
    if proved(d, "==", 1):
        return Lin()
    rest = _make(e.const % d, {a: c for a, c in e.terms if not known_multiple(c, d)})
    lo, hi = span(rest, sizes)
    if proved(0, "<=", lo) and proved(hi, "<", d):
        return rest
    split = _split_small(rest, d, sizes)
    if split is not None:  # e % d = g * (h % (d/g)) + r
        g, high, low = split
        return mod(high, d // g, sizes) * g + low
    return Lin(0, ((Mod(rest, d), 1),))


def clamp(e: Lin, lo: int, hi: int, sizes: Mapping[int, int]) -> Lin:
    elo, ehi = span(e, sizes)
    if proved(lo, "<=", elo) and proved(ehi, "<=", hi):
        return e
    return Lin(0, ((Clamp(e, lo, hi), 1),))


def row_major(coords: tuple[Lin, ...], shape: tuple[int, ...]) -> Lin:
    """The flat row-major offset of `coords` in a contiguous tensor of `shape`."""
    out, stride = Lin(), 1
    for c, n in zip(reversed(coords), reversed(shape), strict=True):
        out = out + c * stride
        stride *= n
    return out


def unflatten(flat: Lin, shape: tuple[int, ...], sizes: Mapping[int, int]) -> tuple[Lin, ...]:
    """Coordinates in `shape` of the row-major flat index `flat` (inverse of row_major)."""
    coords: list[Lin] = []
    stride = 1
    for n in reversed(shape):
        coords.append(mod(floordiv(flat, stride, sizes), n, sizes) if not proved(n, "==", 1) else Lin())
        stride *= n
    return tuple(reversed(coords))


def walk(e: Lin) -> Iterator[Lin]:
    """`e` and every Lin nested in its atoms."""
    yield e
    for a, _ in e.terms:
        if isinstance(a, Div | Mod | Clamp):
            yield from walk(a.arg)


def dyn_names(e: Lin) -> set[str]:
    return {a.name for lin in walk(e) for a, _ in lin.terms if isinstance(a, Dyn)}


def var_ids(e: Lin) -> set[int]:
    return {a.id for lin in walk(e) for a, _ in lin.terms if isinstance(a, Var)}


def can_merge(outer: Var, inner: Var, inner_size: int, exprs: list[Lin]) -> bool:
    """Loops outer/inner can become one loop if every form sees them as one contiguous index."""
    return all(lin.coef(outer) == lin.coef(inner) * inner_size for e in exprs for lin in walk(e))


def merge(e: Lin, outer: Var, inner: Var) -> Lin:
    """Rewrite `e` for outer*inner_size+inner -> inner (valid after `can_merge`)."""
    acc: dict[Atom, int] = {}
    for a, c in e.terms:
        if a == outer:
            continue
        if isinstance(a, Div):
            a = Div(merge(a.arg, outer, inner), a.divisor)
        elif isinstance(a, Mod):
            a = Mod(merge(a.arg, outer, inner), a.divisor)
        elif isinstance(a, Clamp):
            a = Clamp(merge(a.arg, outer, inner), a.lo, a.hi)
        acc[a] = acc.get(a, 0) + c
    return _make(e.const, acc)


def unclamp(e: Lin, var: int) -> Lin:
    """`e` with every clamp of a form in loop `var` alone replaced by the form (valid where the
    schedule proved those clamps inactive: `schedule/peel.py`)."""
    if not any(isinstance(a, Clamp) for a, _ in e.terms):
        return e
    out = Lin(e.const)
    for a, c in e.terms:
        alone = isinstance(a, Clamp) and {b for b, _ in a.arg.terms} == {Var(var)}
        out = out + (a.arg if alone else Lin(0, ((a, 1),))) * c  # type: ignore[union-attr]
    return out


@dataclass(frozen=True)
class Range:
    """[lo, hi) of a pass's SIMD loop `var` in which every CAT select along it takes one input
    (`picks`: select var -> arg index) and `dead` values are not needed; indices are rendered
    through `within` (clamps inactive here dropped; with `block`, div/mod hoisted per block
    of that many elements, counted by loop var `block_var`). Decided by `schedule/peel.py`."""

    lo: int
    hi: int
    picks: tuple[tuple[str, int], ...] = ()
    dead: tuple[str, ...] = ()
    block: int = 0
    block_var: int = -1


def within(e: Lin, var: int, lo: int, hi: int, block: int = 0, block_var: int = -1) -> Lin:
    """`e` for loop `var` in [lo, hi) (a range of a split SIMD loop: `schedule/peel.py`): clamps of
    an affine form in `var` alone that are inactive over the whole range become the form; with
    `block` > 0 the loop runs in blocks of `block` from `block_var` (= lo + m * block), and each
    div / mod of `var` whose quotient is fixed within a block (`blockable`) is taken of
    `block_var` (computed once per block) plus `var - block_var`. Every rewrite is checked here,
    so the result equals `e` for every `var` in the range, whatever the caller decided."""
    out, v = Lin(e.const), Var(var)
    for a, c in e.terms:
        if isinstance(a, Clamp):
            arg = within(a.arg, var, lo, hi, block, block_var)
            ends = [_at(a.arg, v, x) for x in (lo, hi - 1)]
            inactive = None not in ends and a.lo <= min(ends) and max(ends) <= a.hi  # type: ignore[type-var]
            term = arg if inactive else Lin(0, ((Clamp(arg, a.lo, a.hi), 1),))
        elif isinstance(a, Div | Mod):
            arg = within(a.arg, var, lo, hi, block, block_var)
            if block and blockable(arg, a.divisor, var, lo, block):
                base = arg - Lin.var(v) + Lin.var(Var(block_var))
                # base is a multiple of `block`: base % block is 0, base % d (d a multiple) is not known
                whole = Lin() if isinstance(a, Mod) and a.divisor == block else Lin(0, ((type(a)(base, a.divisor), 1),))
                term = whole + (Lin.var(v) - Lin.var(Var(block_var)) if isinstance(a, Mod) else 0)
            else:
                term = Lin(0, ((type(a)(arg, a.divisor), 1),))
        else:
            term = Lin(0, ((a, 1),))
        out = out + term * c
    return out


def _at(e: Lin, v: Var, x: int) -> int | None:
    """The value of `e` at `v` = x when `e` is an affine form in `v` alone, else None."""
    if not all(a == v and isinstance(c, int) for a, c in e.terms) or not isinstance(e.const, int):
        return None
    return e.const + e.coef(v) * x


def blockable(arg: Lin, d: int, var: int, lo: int, block: int) -> bool:
    """Whether `arg // d` and `arg % d` are fixed within every block of `block` values of `var`
    starting at lo + m * block: `arg` is var + const + nonnegative multiples of `block` of other
    loop vars, `block` divides `d`, and `arg` is a nonnegative multiple of `block` at each block's
    start (C++ division truncates, so it must not be negative there)."""
    v = Var(var)
    if not isinstance(d, int) or d % block or arg.coef(v) != 1 or not isinstance(arg.const, int):
        return False
    others = [(a, c) for a, c in arg.terms if a != v]
    if not all(isinstance(a, Var) and isinstance(c, int) and c >= 0 and c % block == 0 for a, c in others):
        return False
    return (lo + arg.const) % block == 0 and lo + arg.const >= 0


def substitute(e: Lin, var: int, form: Lin, sizes: Mapping[int, int]) -> Lin:
    """`e` with loop `var` replaced by `form`, each div / mod / clamp refolded over `sizes` (a
    residue split's v = s * q + b: `(s * q + b) / s` folds to q, `% s` to b: `schedule/residue.py`)."""
    if var not in var_ids(e):
        return e
    out = Lin(e.const)
    for a, c in e.terms:
        if a == Var(var):
            term = form
        elif isinstance(a, Div):
            term = floordiv(substitute(a.arg, var, form, sizes), a.divisor, sizes)
        elif isinstance(a, Mod):
            term = mod(substitute(a.arg, var, form, sizes), a.divisor, sizes)
        elif isinstance(a, Clamp):
            term = clamp(substitute(a.arg, var, form, sizes), a.lo, a.hi, sizes)
        else:
            term = Lin(0, ((a, 1),))
        out = out + term * c
    return out


def render(e: Lin, name: Mapping[int, str]) -> str:
    """C++ text of `e` (int64_t arithmetic); `name` maps var ids to loop variable names."""
    parts = [_term(a, c, name) for a, c in e.terms]
    if e.const or not parts:
        parts.append(str(e.const))
    return " + ".join(parts).replace("+ -", "- ")


def _term(a: Atom, c: int, name: Mapping[int, str]) -> str:
    if isinstance(a, Var):
        s = name[a.id]
    elif isinstance(a, Div):
        s = f"(({render(a.arg, name)}) / {a.divisor})"
    elif isinstance(a, Mod):
        s = f"(({render(a.arg, name)}) % {a.divisor})"
    elif isinstance(a, Clamp):
        s = f"vf_clamp_i({render(a.arg, name)}, {a.lo}, {a.hi})"
    else:
        s = f"(int64_t){a.name}"
    return s if c == 1 else f"{c} * {s}"
