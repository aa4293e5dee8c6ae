"""Motifs: short op sequences that real models fuse and that single random steps rarely build.

Each motif is a few ordinary steps with their choices steered (a reshape that merges the dims a
reduction then reads; a conv feeding a training BatchNorm; a norm -> linear -> residual block; a
softmax over a permuted view; attention written out, which training graphs rewrite into the flash
kernels; planes shifted by pads on two dims and concatenated or summed, the col2im shape g++ 12's
AVX2 gathers once miscompiled). The steps are the same as the generic builders', so a failing
program prints like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st
from tests.fuzz.graphs import Gen, Val, weight
from tests.fuzz.graphs_gemm import linear_view_epilogue
from tests.fuzz.graphs_layout import merge_split
from tests.fuzz.graphs_nn import add_norm, conv, linear_of
from tests.fuzz.graphs_ops import add_reduce
from tests.fuzz.ops import B, N, R, S, U, V
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


def written_attention(g: Gen) -> int | None:
    """softmax(q @ k^T * scale, -1) @ v with k and v fresh (or q itself): the pattern the training
    capture rewrites into SDPA_LSE / SDPA_BACKWARD (entry/attention_rewrite.py) and inference into SDPA."""
    q = g.pick(lambda v: v.is_float and len(v.shape) in (3, 4) and v.shape[-2] >= 1 and v.shape[-1] >= 1)
    if q is None:
        return None
    vq = g.vals[q]
    batch, e = vq.shape[:-2], vq.shape[-1]
    # At least 2 keys, and in backward programs not q on itself: over one key (or a one-hot softmax,
    # q . q over a long head size) q's gradient is 0 exactly, and the flash backward's
    # P * (dP - delta) leaves rounding noise there (docs/attention.md) against a 0 tolerance.
    keys = vq.shape[-2] if g.flag(3) and vq.shape[-2] >= 2 and not g.cfg.grad else g.choice((5, 2, 16, 7))
    k = q if keys == vq.shape[-2] else weight(g, (*batch, keys, e), vq.dtype)
    v = q if k == q else weight(g, (*batch, keys, g.choice((e, 8, 3))), vq.dtype)
    return _attend(g, q, k, v)


def _attend(g: Gen, q: int, k: int, v: int) -> int | None:
    """softmax(q @ k^T * scale, -1) @ v."""
    vq, e, keys = g.vals[q], g.vals[q].shape[-1], g.vals[k].shape[-2]
    kt = g.add(Step(Kind.VIEW, V.TRANSPOSE, (k,), (-1, -2)), g.vals[k].bound, g.vals[k].exact)
    if kt is None:
        return None
    scores = g.add(Step(Kind.MATMUL, None, (q, kt)), max(e, 1) * vq.bound * max(g.vals[k].bound, 1.0), False)
    if scores is None:
        return None
    scale = g.choice((1 / math.sqrt(max(e, 1)), 0.3))
    scaled = g.add(Step(Kind.SCALAR, S.MUL, (scores,), (scale,)), g.vals[scores].bound * scale, False)
    if scaled is None:
        return scores
    probs = g.add(Step(Kind.NORM, N.SOFTMAX, (scaled,), (-1, 0.0, False, False)), 1.0, False)
    if probs is None:
        return scaled
    return g.add(Step(Kind.MATMUL, None, (probs, v)), max(keys, 1) * max(g.vals[v].bound, 1.0), False)


def shifted_planes(g: Gen) -> int | None:
    """cat or sum of F.pad(x, (dx, -dx, dy, -dy)): copies of the last two dims shifted with zero
    rows and columns, which lower to clamped-index loads (a conv data gradient's col2im)."""
    x = g.pick(lambda v: v.is_float and len(v.shape) >= 2 and min(v.shape[-2:]) >= 2)
    if x is None:
        return None
    v, parts = g.vals[x], []
    for _ in range(g.draw(st.integers(2, 4))):
        dx, dy = g.draw(st.integers(-3, 3)), g.draw(st.integers(-3, 3))
        p = g.add(Step(Kind.VIEW, V.PAD, (x,), ((dx, -dx, dy, -dy), 0)), v.bound, v.exact)
        if p is not None:
            parts.append(p)
    if len(parts) < 2:
        return parts[0] if parts else None
    if g.flag():
        dim = g.draw(st.integers(0, len(v.shape) - 1))
        return g.add(Step(Kind.CAT, None, tuple(parts), (dim,)), v.bound, v.exact)
    acc = parts[0]
    for i, p in enumerate(parts[1:], 2):
        nxt = g.add(Step(Kind.BINARY, B.ADD, (acc, p)), v.bound * i, v.exact)
        acc = acc if nxt is None else nxt
    return acc


def stacked_attention(g: Gen) -> int | None:
    """q, k, v selected from one [B, T, 3, H, D] projection permuted to [3, B, H, T, D], then attention:
    in training the stacked gradient is stored in the projection's order (passes/grad_layout.py)."""
    b, t, h, d = g.choice((1, 2)), g.choice((2, 5, 16, 7)), g.choice((1, 2, 3)), g.choice((4, 8, 3))
    x = weight(g, (b, t, 3, h, d), g.choice((torch.float32, torch.float64)))
    p = g.add(Step(Kind.VIEW, V.PERMUTE, (x,), ((2, 0, 3, 1, 4),)), g.vals[x].bound, g.vals[x].exact)
    if p is None:
        return None
    qkv = [g.add(Step(Kind.VIEW, V.SELECT, (p,), (0, i)), g.vals[p].bound, g.vals[p].exact) for i in range(3)]
    if any(i is None for i in qkv):
        return None
    return _attend(g, *qkv)  # type: ignore[arg-type]


MOTIFS: tuple[Callable[[Gen], int | None], ...] = (
    reshape_reduce,
    conv_norm,
    norm_block,
    permuted_softmax,
    written_attention,
    shifted_planes,
    stacked_attention,
    linear_view_epilogue,
)
