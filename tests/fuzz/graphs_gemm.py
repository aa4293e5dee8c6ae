"""Motif: a GEMM epilogue read through a view of the GEMM's output.

Linear (with or without bias; output widths that are primes, 1, or products such as 3 * h * d)
-> a view of the output (the last dim split into (a, b) or (3, h, d), batch dims merged, a dim
merged across the split, an unsqueeze; sometimes one of q, k, v selected, a permute after) -> pointwise epilogues over
the view (a bias broadcast through it, GELU, a product with a tensor of the view's shape or a
broadcast of it) -> sometimes a reduction. This is the shape of a fused qkv projection, whose
epilogue vfuse fuses into the GEMM over the view's loop space (codegen/cpp/contraction._groups).

`dyn_linear_view_epilogue` draws the same over a batch or sequence dim of a marker size
(graphs_dynamic.py): the views relative to the runtime shape (the split an `unflatten` of the
last dim, batch dims merged by `reshape(-1, ...)`), for a build over symbolic sizes.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st
from tests.fuzz.graphs import Gen, weight
from tests.fuzz.graphs_ops import add_reduce
from tests.fuzz.ops import B, R, U, V
from tests.fuzz.program import Kind, Step

# Output widths as (leading factors of the split, last factor): 3 * h * d, a * b, a prime, 1.
WIDTHS = ((3, 2, 4), (3, 1, 5), (3, 4, 8), (2, 8), (5, 3), (7,), (1,), (13,), (3, 3, 1), (4, 16), (17, 2))
KS = (3, 1, 7, 13, 16, 17, 32)
BATCH = (2, 3, 1, 5, 7, 4)


def _x(g: Gen) -> int:
    """The Linear's input: an earlier float value of rank 1-3, or a fresh [*batch, k]."""
    x = g.pick(lambda v: v.is_float and 1 <= len(v.shape) <= 3 and 0 < v.numel <= 512 and v.bound < 50)
    if x is not None and g.flag(3):
        return x
    floats = (torch.float32, torch.float32, torch.float64) + (() if g.cfg.grad else (torch.float32, torch.bfloat16))
    dtype = g.choice(floats)
    batch = tuple(g.choice(BATCH) for _ in range(g.draw(st.integers(0, 2))))
    return weight(g, (*batch, g.choice(KS)), dtype)


def _view(g: Gen, batch: tuple[int, ...], factors: tuple[int, ...]) -> tuple[int, ...]:
    """A view of [*batch, prod(factors)]: the last dim split into `factors`, with batch dims
    merged, or the last batch dim merged with the split's first factor, or a size-1 dim added."""
    how = g.draw(st.integers(0, 3))
    if how == 1 and len(batch) >= 2:
        return (math.prod(batch), *factors)
    if how == 2 and batch:
        return (*batch[:-1], batch[-1] * factors[0], *factors[1:])
    if how == 3:
        shape = [*batch, *factors]
        shape.insert(g.draw(st.integers(0, len(shape))), 1)
        return tuple(shape)
    return (*batch, *factors)


def _broadcast_of(g: Gen, shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with some dims 1 and some leading dims dropped (a bias through the view)."""
    drop = g.draw(st.integers(0, len(shape))) if g.flag() else 0
    return tuple(1 if g.flag(3) else d for d in shape[drop:])


def _epilogue(g: Gen, y: int) -> int:
    """One to three pointwise ops over `y`: + a broadcast bias, GELU (or tanh, relu), * a tensor."""
    for _ in range(g.draw(st.integers(1, 3))):
        v = g.vals[y]
        how = g.draw(st.integers(0, 2))
        if how == 0:
            b = weight(g, _broadcast_of(g, v.shape), v.dtype)
            nxt = g.add(Step(Kind.BINARY, B.ADD, (y, b) if g.flag() else (b, y)), v.bound + 4.5, False)
        elif how == 1:
            fn = g.choice((U.GELU, U.GELU, U.TANH, U.RELU, U.SILU))
            nxt = g.add(Step(Kind.UNARY, fn, (y,)), v.bound, False)
        else:
            m = weight(g, v.shape if g.flag() else _broadcast_of(g, v.shape), v.dtype)
            nxt = g.add(Step(Kind.BINARY, B.MUL, (y, m)), v.bound * 4.5, False)
        y = y if nxt is None else nxt
    return y


def _linear(g: Gen, x: int, factors: tuple[int, ...]) -> tuple[int | None, float]:
    """Linear of `x` to prod(factors) features, with or without bias; (its value, its bound)."""
    v = g.vals[x]
    srcs = [x, weight(g, (math.prod(factors), v.shape[-1]), v.dtype)]
    if g.flag():
        srcs.append(weight(g, (math.prod(factors),), v.dtype))
    bound = max(v.shape[-1], 1) * v.bound * 4.5 + 4.5
    return g.add(Step(Kind.LINEAR, None, tuple(srcs), (g.flag(5),)), bound, False), bound


def linear_view_epilogue(g: Gen) -> int | None:
    """Linear -> view of its output -> pointwise epilogue through the view -> maybe a reduction."""
    x = _x(g)
    v = g.vals[x]
    factors = g.choice(WIDTHS)
    lin, bound = _linear(g, x, factors)
    if lin is None:
        return None
    view = _view(g, v.shape[:-1], factors)
    y = g.add(Step(Kind.VIEW, V.RESHAPE, (lin,), (view,)), bound, False)
    if y is None:
        return lin
    return _after_view(g, y, len(factors), bound)


def dyn_linear_view_epilogue(g: Gen) -> int | None:
    """`linear_view_epilogue` over a marker-sized batch or sequence dim (a DynGen: graphs_dynamic.py)."""
    from tests.fuzz.graphs_dynamic import MARKERS, SV, DynKind  # it imports this module's motif

    batch = [g.choice(BATCH) for _ in range(g.draw(st.integers(0, 2)))]
    batch.insert(g.draw(st.integers(0, len(batch))), MARKERS[0])
    if len(batch) > 1 and g.flag(3):
        batch[next(i for i, n in enumerate(batch) if n != MARKERS[0])] = MARKERS[1]
    x = weight(g, (*batch, g.choice(KS)), g.choice((torch.float32, torch.float32, torch.float64)))
    factors = g.choice(WIDTHS)
    lin, bound = _linear(g, x, factors)
    if lin is None:
        return None
    y = lin
    for f in reversed(factors[1:]):  # the last dim split: unflatten(-1, (-1, f)), innermost first
        rank = len(g.vals[y].shape)
        y = g.add(Step(DynKind.SYMVIEW, SV.UNFLATTEN, (y,), (rank - 1 if y == lin else rank - 2, f)), bound, False)
        if y is None:
            return lin
    how = g.draw(st.integers(0, 2))
    if how == 1 and len(batch) >= 2:  # batch dims merged (a split's first factor too, sometimes)
        merged = len(batch) + (1 if g.flag() and len(factors) > 1 else 0)
        y = g.add(Step(DynKind.SYMVIEW, SV.MERGE_HEAD, (y,), (merged,)), bound, False) or y
    elif how == 2:
        y = (
            g.add(Step(Kind.VIEW, V.UNSQUEEZE, (y,), (g.draw(st.integers(0, len(g.vals[y].shape))),)), bound, False)
            or y
        )
    return _after_view(g, y, len(factors), bound)


def _after_view(g: Gen, y: int, nfactors: int, bound: float) -> int:
    """Maybe one of q, k, v selected, maybe a permute, the epilogue, maybe a reduction."""
    view = g.vals[y].shape
    if g.flag(4):  # one of q, k, v of a qkv view: a select on one of the split's dims
        dim = len(view) - nfactors + g.draw(st.integers(0, nfactors - 1))
        at = g.draw(st.integers(0, max(view[dim] - 1, 0)))
        y = g.add(Step(Kind.VIEW, V.SELECT, (y,), (dim, at)), bound, False) or y
    rank = len(g.vals[y].shape)
    if g.flag(3) and rank >= 2:
        perm = tuple(g.draw(st.permutations(range(rank))))
        y = g.add(Step(Kind.VIEW, V.PERMUTE, (y,), (perm,)), bound, False) or y
    y = _epilogue(g, y)
    rank = len(g.vals[y].shape)
    if g.flag(3) or rank == 0:
        return y
    dims = tuple(sorted({g.draw(st.integers(0, rank - 1)) for _ in range(g.draw(st.integers(1, 2)))}))
    return add_reduce(g, y, g.choice((R.SUM, R.AMAX, R.MEAN)), dims, g.flag()) or y
