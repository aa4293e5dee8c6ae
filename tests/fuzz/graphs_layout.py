"""Fuzz builders for layout: views, reshapes, slices, expands, pads, cat, gathers, dropout."""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import strategies as st
from tests.fuzz.graphs import Gen, index_input, small_shape
from tests.fuzz.ops import G, V
from tests.fuzz.program import Kind, Step


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return [*out, n] if n > 1 else out


def _merge(g: Gen, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Adjacent dims [i, j] merged into one (flattening spatial dims, the common real reshape)."""
    if len(shape) < 2:
        return shape
    i = g.draw(st.integers(0, len(shape) - 2))
    j = g.draw(st.integers(i + 1, len(shape) - 1))
    return (*shape[:i], math.prod(shape[i : j + 1]), *shape[j + 1 :])


def _split(g: Gen, shape: tuple[int, ...]) -> tuple[int, ...]:
    """One dim split in two by one of its prime factors."""
    splittable = [i for i, d in enumerate(shape) if len(_factors(d)) > 1]
    if not splittable:
        return shape
    i = g.choice(splittable)
    f = g.choice(sorted(set(_factors(shape[i]))))
    return (*shape[:i], f, shape[i] // f, *shape[i + 1 :])


def merge_split(g: Gen, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Trailing dims merged into one (x.view(n, c, h * w)), sometimes another dim split too."""
    if len(shape) < 2:
        return _split(g, shape)
    i = g.draw(st.integers(0, len(shape) - 2))
    merged = (*shape[:i], math.prod(shape[i:]))
    return _split(g, merged) if g.flag() else merged


def _refactor(g: Gen, numel: int) -> tuple[int, ...]:
    """A random factorization of numel into 1-4 dims."""
    dims = [1] * g.draw(st.integers(1, 4))
    for f in _factors(numel):
        dims[g.draw(st.integers(0, len(dims) - 1))] *= f
    return tuple(dims)


def _reshape(g: Gen, shape: tuple[int, ...]) -> tuple | None:
    """Another shape of the same elements: dims merged, split, both, or refactored at random;
    sometimes with one dim given as -1."""
    numel = math.prod(shape)
    if numel == 0:
        return ((*shape, 1),) if g.flag() else ((0, -1),) if len(shape) else None
    how = g.draw(st.integers(0, 4))
    if how == 0:
        new = _merge(g, shape)
    elif how == 1:
        new = _split(g, shape)
    elif how == 2:
        new = _split(g, _merge(g, shape))
    elif how == 3:
        new = _refactor(g, numel)
    else:
        new = (1, *shape) if g.flag() else (numel,)
    if g.flag(4) and new:
        j = g.draw(st.integers(0, len(new) - 1))
        new = (*new[:j], -1, *new[j + 1 :])
    return (tuple(new),)


def _view_params(g: Gen, fn: V, shape: tuple[int, ...]) -> tuple | None:
    rank = len(shape)
    if fn is V.RESHAPE:
        return _reshape(g, shape)
    if fn is V.PERMUTE:
        return (tuple(g.draw(st.permutations(range(rank)))),) if rank >= 2 else None
    if fn is V.TRANSPOSE:
        return (g.draw(st.integers(0, rank - 1)), g.draw(st.integers(-rank, rank - 1))) if rank >= 2 else None
    if fn is V.EXPAND:
        ones = [i for i, d in enumerate(shape) if d == 1]
        k = g.choice((2, 3, 5))
        if ones and g.flag(4) is False:
            i = g.choice(ones)
            return ((*shape[:i], k, *shape[i + 1 :]),)
        return ((k, *shape),)
    if fn is V.UNSQUEEZE:
        return (g.draw(st.integers(-rank - 1, rank)),)
    if fn is V.SQUEEZE:
        ones = [i for i, d in enumerate(shape) if d == 1]
        return (g.choice(ones),) if ones else None
    if fn in (V.SLICE, V.SELECT):
        dims = [i for i, d in enumerate(shape) if d >= 1]
        if not dims:
            return None
        d = g.choice(dims)
        n = shape[d]
        if fn is V.SELECT:
            return (d, g.draw(st.integers(-n, n - 1)))
        start = g.draw(st.integers(0, n - 1))
        stop = g.choice((None, n, start + 1, n - 1))
        return (d, start - n if g.flag(4) else start, stop, g.choice((1, 2, 3)))
    if fn is V.FLATTEN:
        return (0, -1) if rank < 2 else (g.draw(st.integers(0, rank - 2)), g.draw(st.integers(-1, rank - 1)))
    if fn is V.CONTIGUOUS:
        return ()
    pads = tuple(g.choice((0, 1, 2, -1)) for _ in range(2 * min(rank, 2)))
    return (pads, 0) if not rank or not g.flag() else (pads, 3)


# Views drawn, with repeats as weights: reshapes (merges and splits of dims that later ops
# index through) most often.
VIEWS = (*(V.RESHAPE,) * 4, *(V.PERMUTE, V.TRANSPOSE, V.EXPAND, V.SLICE) * 2, *V)


def view(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fn = g.choice(VIEWS)
    params = _view_params(g, fn, v.shape)
    if params is None:
        return None
    bound = max(v.bound, 3.0) if fn is V.PAD else v.bound
    return g.add(Step(Kind.VIEW, fn, (x,), params), bound, v.exact)


def cat(g: Gen) -> int | None:
    x = g.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    vx = g.vals[x]
    d = g.draw(st.integers(0, len(vx.shape) - 1))

    def fits(v: object) -> bool:
        s = v.shape  # type: ignore[attr-defined]
        return len(s) == len(vx.shape) and all(a == b for i, (a, b) in enumerate(zip(s, vx.shape)) if i != d)

    srcs = [x] + [g.pick(fits) for _ in range(g.draw(st.integers(1, 3)))]
    vals = [g.vals[i] for i in srcs]  # type: ignore[index]
    bound = max(v.bound for v in vals)
    return g.add(
        Step(Kind.CAT, None, tuple(srcs), (d - len(vx.shape) if g.flag(3) else d,)), bound, all(v.exact for v in vals)
    )  # type: ignore[arg-type]


def gather(g: Gen) -> int | None:
    fn = g.choice(list(G))
    if fn is G.EMBEDDING:
        x = g.pick(lambda v: len(v.shape) == 2 and v.shape[0] >= 1)
    else:
        x = g.pick(lambda v: len(v.shape) >= 1 and max(v.shape) >= 1)
    if x is None:
        return None
    v = g.vals[x]
    rank = len(v.shape)
    if fn is G.EMBEDDING:
        idx = index_input(g, small_shape(g, g.draw(st.integers(1, 2))), 0, v.shape[0])
        params: tuple = ()
    elif fn is G.INDEX:
        n = v.shape[0]
        if n == 0:
            return None
        low = -n if g.cfg.negative_indices else 0
        idx = index_input(g, small_shape(g, g.draw(st.integers(1, 2))), low, n)
        params = ()
    else:
        d = g.choice([i for i in range(rank) if v.shape[i] >= 1])
        shape = (g.choice((3, 1, 5, 0)),) if fn is G.INDEX_SELECT else _along(g, v.shape, d)
        idx = index_input(g, shape, 0, v.shape[d])
        params = (d,)
    return g.add(Step(Kind.GATHER, fn, (x, idx), params), v.bound, v.exact)


def _along(g: Gen, shape: tuple[int, ...], d: int) -> tuple[int, ...]:
    """An index shape for torch.gather along d: no larger than `shape` off d, any size on d."""
    return tuple(g.choice((3, 1, 5)) if i == d else g.draw(st.integers(min(1, n), n)) for i, n in enumerate(shape))


def dropout(g: Gen) -> int | None:
    x = g.pick(lambda v: v.is_float)
    if x is None:
        return None
    v = g.vals[x]
    return g.add(Step(Kind.DROPOUT, None, (x,)), v.bound, v.exact)


BUILDERS: dict[Kind, Callable[[Gen], int | None]] = {
    Kind.VIEW: view,
    Kind.CAT: cat,
    Kind.GATHER: gather,
    Kind.DROPOUT: dropout,
}
