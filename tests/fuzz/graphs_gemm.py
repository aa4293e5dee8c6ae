"""Motif: a GEMM epilogue read through a view of the GEMM's output.

Linear (with or without bias; output widths that are primes, 1, or products such as 3 * h * d)
-> a view of the output (the last dim split into (a, b) or (3, h, d), batch dims merged, a dim
merged across the split, an unsqueeze; sometimes one of q, k, v selected, a permute after) -> pointwise epilogues over
the view (a bias broadcast through it, GELU, a product with a tensor of the view's shape or a
broadcast of it) -> sometimes a reduction. This is the shape of a fused qkv projection, whose
epilogue vfuse fuses into the GEMM over the view's loop space (codegen/cpp/contraction._groups).
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


def linear_view_epilogue(g: Gen) -> int | None:
    """Linear -> view of its output -> pointwise epilogue through the view -> maybe a reduction."""
    x = _x(g)
    v = g.vals[x]
    factors = g.choice(WIDTHS)
    srcs = [x, weight(g, (math.prod(factors), v.shape[-1]), v.dtype)]
    if g.flag():
        srcs.append(weight(g, (math.prod(factors),), v.dtype))
    bound = max(v.shape[-1], 1) * v.bound * 4.5 + 4.5
    lin = g.add(Step(Kind.LINEAR, None, tuple(srcs), (g.flag(5),)), bound, False)
    if lin is None:
        return None
    view = _view(g, v.shape[:-1], factors)
    y = g.add(Step(Kind.VIEW, V.RESHAPE, (lin,), (view,)), bound, False)
    if y is None:
        return lin
    if g.flag(4):  # one of q, k, v of a qkv view: a select on one of the split's dims
        dim = len(view) - len(factors) + g.draw(st.integers(0, len(factors) - 1))
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
