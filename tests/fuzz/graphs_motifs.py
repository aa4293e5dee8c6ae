"""Motifs: short op sequences that real models fuse and that single random steps rarely build.

Each motif is a few ordinary steps with their choices steered (a reshape that merges the dims a
reduction then reads; a conv feeding a training BatchNorm; a norm -> linear -> residual block; a
softmax over a permuted view). The steps are the same as the generic builders', so a failing
program prints like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import strategies as st
from tests.fuzz.graphs import Gen, Val
from tests.fuzz.graphs_layout import merge_split
from tests.fuzz.graphs_nn import add_norm, conv, linear_of
from tests.fuzz.graphs_ops import add_reduce
from tests.fuzz.ops import B, N, R, U, V
from tests.fuzz.program import Kind, Step


def _float_rank(lo: int) -> Callable[[Val], bool]:
    return lambda v: v.is_float and len(v.shape) >= lo and v.numel >= 16


def reshape_reduce(g: Gen) -> int | None:
    """x.view(merged and split dims).reduce(several dims incl. a merged one), then x' - r."""
    x = g.pick(_float_rank(2))
    if x is None:
        return None
    v = g.vals[x]
    new = merge_split(g, v.shape)
    r = g.add(Step(Kind.VIEW, V.RESHAPE, (x,), (new,)), v.bound, v.exact)
    if r is None or len(new) < 2:
        return r
    rank = len(new)
    last = rank - 1 if g.flag() else max(range(rank), key=lambda i: new[i])
    others = [d for d in range(rank) if d != last and g.flag()] or [(last - 1) % rank]
    dims = tuple(sorted({last, *others}))
    fn = g.choice((R.SUM, R.MEAN, R.AMAX, R.VAR, R.AMIN))
    keep = g.flag(3) is False
    y = add_reduce(g, r, fn, dims, keep)
    if y is None or not keep:
        return y
    return g.add(Step(Kind.BINARY, B.SUB, (r, y)), g.vals[r].bound + g.vals[y].bound, False)


def conv_norm(g: Gen) -> int | None:
    """conv2d -> BatchNorm (training statistics or eval) or GroupNorm -> ReLU."""
    y = conv(g)
    if y is None:
        return None
    z = add_norm(g, y, g.choice((N.BATCH_TRAIN, N.BATCH_TRAIN, N.BATCH_EVAL, N.GROUP)))
    if z is None:
        return y
    return g.add(Step(Kind.UNARY, U.RELU, (z,)), g.vals[z].bound, False)


def norm_block(g: Gen) -> int | None:
    """x + linear(norm(x)) (with GELU), the transformer MLP shape."""
    x = g.pick(lambda v: v.is_float and len(v.shape) >= 1 and v.shape[-1] >= 1)
    if x is None:
        return None
    n = add_norm(g, x, g.choice((N.LAYER, N.RMS)))
    if n is None:
        return None
    h = linear_of(g, n, out=g.vals[x].shape[-1])
    if h is None:
        return n
    return g.add(Step(Kind.BINARY, B.ADD, (x, h)), g.vals[x].bound + g.vals[h].bound, False)


def permuted_softmax(g: Gen) -> int | None:
    """softmax or log_softmax along a dim of a permuted view, then a reduction of it."""
    x = g.pick(_float_rank(2))
    if x is None:
        return None
    v = g.vals[x]
    perm = tuple(g.draw(st.permutations(range(len(v.shape)))))
    p = g.add(Step(Kind.VIEW, V.PERMUTE, (x,), (perm,)), v.bound, v.exact)
    if p is None:
        return None
    s = add_norm(g, p, g.choice((N.SOFTMAX, N.LOG_SOFTMAX)))
    if s is None:
        return p
    dims = (g.draw(st.integers(0, len(v.shape) - 1)),)
    bound = g.vals[s].bound * math.prod(v.shape)
    return add_reduce(g, s, R.SUM, dims, g.flag()) if bound < 1e6 else s


MOTIFS: tuple[Callable[[Gen], int | None], ...] = (reshape_reduce, conv_norm, norm_block, permuted_softmax)
