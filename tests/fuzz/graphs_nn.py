"""Fuzz builders for the nn families: softmax and norms, matmul/linear, conv2d, attention."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st
from tests.fuzz.graphs import Gen, Val, weight
from tests.fuzz.ops import N, P, V
from tests.fuzz.program import Kind, Step, Values

EPS = (1e-5, 1e-3, 0.1)


def _float(v: Val) -> bool:
    return v.is_float


def _affine(g: Gen, x: int, shape: tuple[int, ...], bias: bool = True) -> tuple[tuple[int, ...], bool, bool]:
    dtype = g.vals[x].dtype
    has_w, has_b = g.flag(), bias and g.flag()
    srcs = [x]
    if has_w:
        srcs.append(weight(g, shape, dtype))
    if has_b:
        srcs.append(weight(g, shape, dtype))
    return tuple(srcs), has_w, has_b


def norm(g: Gen) -> int | None:
    x = g.pick(_float)
    if x is None:
        return None
    return add_norm(g, x, g.choice(list(N)))


def add_norm(g: Gen, x: int, fn: N) -> int | None:
    v = g.vals[x]
    rank = len(v.shape)
    eps = g.choice(EPS)
    if fn in (N.SOFTMAX, N.LOG_SOFTMAX):
        dim = g.draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
        bound = 1.0 if fn is N.SOFTMAX else 2 * v.bound + math.log(v.numel + 1) + 1
        return g.add(Step(Kind.NORM, fn, (x,), (dim, 0.0, False, False)), bound, False)
    if fn in (N.LAYER, N.RMS):
        if rank == 0:
            return None
        n = g.draw(st.integers(1, min(rank, 3)))
        srcs, has_w, has_b = _affine(g, x, v.shape[-n:], bias=fn is N.LAYER)
        bound = 4.5 * min(math.sqrt(math.prod(v.shape[-n:])), 8.0) + 4.5
        return g.add(Step(Kind.NORM, fn, srcs, (n, eps, has_w, has_b)), bound, False)
    if rank < 2:
        return None
    c = v.shape[1]
    if fn is N.GROUP:
        groups = g.choice([d for d in range(1, c + 1) if c % d == 0] or [1])
        srcs, has_w, has_b = _affine(g, x, (c,))
        return g.add(Step(Kind.NORM, fn, srcs, (groups, eps, has_w, has_b)), 45.0, False)
    srcs, has_w, has_b = _affine(g, x, (c,))
    if fn is N.BATCH_EVAL:
        srcs = (*srcs, g.fresh((c,), v.dtype, stat=True), g.fresh((c,), v.dtype, values=Values.POSITIVE, stat=True))
    return g.add(Step(Kind.NORM, fn, srcs, (0, eps, has_w, has_b)), 8 * (v.bound + 4.5) + 4.5, False)


def matmul(g: Gen) -> int | None:
    a = g.pick(lambda v: len(v.shape) >= 1 and v.dtype != torch.bool)
    if a is None:
        return None
    va = g.vals[a]
    k = va.shape[-1]
    if len(va.shape) >= 2 and g.flag(3):
        # a @ a^T through a transpose view step
        b = g.add(Step(Kind.VIEW, V.TRANSPOSE, (a,), (-1, -2)), va.bound, va.exact)
    else:
        batch = va.shape[:-2] if len(va.shape) > 2 and g.flag() else ()
        out_shape = () if g.flag(6) else (g.choice((3, 1, 5, 16, 7)),)
        b = weight(g, (*batch, k, *out_shape), va.dtype)
    if b is None:
        return None
    bound = max(k, 1) * va.bound * max(va.bound, 4.5)
    return g.add(Step(Kind.MATMUL, None, (a, b)), bound, not va.is_float)


def linear(g: Gen) -> int | None:
    x = g.pick(lambda v: _float(v) and len(v.shape) >= 1)
    if x is None:
        return None
    return linear_of(g, x, g.choice((8, 1, 3, 17, 32)))


def linear_of(g: Gen, x: int, out: int) -> int | None:
    """F.linear(x, fresh weight [out, in], optional fresh bias), optionally followed by GELU."""
    v = g.vals[x]
    k = v.shape[-1]
    srcs = [x, weight(g, (out, k), v.dtype)]
    if g.flag():
        srcs.append(weight(g, (out,), v.dtype))
    gelu = g.flag()
    return g.add(Step(Kind.LINEAR, None, tuple(srcs), (gelu,)), max(k, 1) * v.bound * 4.5 + 4.5, False)


def conv(g: Gen, x: int | None = None) -> int | None:
    """conv2d of a 4-D float value (or of a fresh input when there is none)."""
    x = g.pick(lambda v: _float(v) and len(v.shape) == 4) if x is None else x
    if x is None:
        dtype = g.choice((torch.float32, torch.float32, torch.float64, torch.bfloat16))
        if g.cfg.grad:
            dtype = torch.float32
        x = g.fresh((g.choice((1, 2)), g.choice((3, 4, 1)), g.choice((5, 8, 7)), g.choice((6, 9, 4))), dtype)
    v = g.vals[x]
    c = v.shape[1]
    groups = g.choice([d for d in range(1, c + 1) if c % d == 0] or [1])
    out_c = groups * g.choice((1, 2, 3))
    kh, kw = g.choice((1, 3, 2)), g.choice((1, 3, 2))
    srcs = [x, weight(g, (out_c, c // groups, kh, kw), v.dtype)]
    if g.flag():
        srcs.append(weight(g, (out_c,), v.dtype))
    params = (g.choice((1, 2)), g.choice((0, 1)), g.choice((1, 1, 2)), groups)
    bound = max(c // groups, 1) * kh * kw * v.bound * 4.5 + 4.5
    return g.add(Step(Kind.CONV, None, tuple(srcs), params), bound, False)


def pool(g: Gen) -> int | None:
    """max_pool2d (any window, stride, padding, dilation, ceil_mode) or avg_pool2d (windows that tile
    the input, or any window, stride, padding, ceil_mode) of a 4-D fp32/fp64 value, forward and
    backward (max_pool2d's backward is a SCATTER_ADD on CPU: ir/defs/scatter.py)."""
    x = g.pick(lambda v: v.dtype in (torch.float32, torch.float64) and len(v.shape) == 4 and v.numel > 0)
    if x is None:
        shape = (g.choice((1, 2)), g.choice((1, 3)), g.choice((5, 8, 7, 12)), g.choice((6, 9, 4, 11)))
        x = g.fresh(shape, torch.float32)
    v = g.vals[x]
    h, w = v.shape[-2:]
    if g.flag():
        k = g.choice([k for k in (1, 2, 3, 4) if h % k == 0 and w % k == 0])
        return g.add(Step(Kind.POOL, P.AVG, (x,), (k, k, 0, 1, False)), v.bound, False)
    k = g.choice((1, 2, 3))
    stride, padding, dilation = g.choice((1, 2, k)), g.choice(tuple(range(k // 2 + 1))), g.choice((1, 1, 2))
    if g.flag():
        if k > min(h, w) + 2 * padding:
            return None
        return g.add(Step(Kind.POOL, P.AVG, (x,), (k, stride, padding, 1, g.flag())), v.bound, False)
    if (k - 1) * dilation + 1 > min(h, w) + 2 * padding:
        return None
    return g.add(Step(Kind.POOL, P.MAX, (x,), (k, stride, padding, dilation, g.flag())), v.bound, v.exact)


def sdpa(g: Gen) -> int | None:
    q = g.pick(lambda v: _float(v) and len(v.shape) in (3, 4) and v.shape[-1] >= 1 and v.numel > 0)
    if q is None:
        return None
    vq = g.vals[q]
    batch, length, e = vq.shape[:-2], vq.shape[-2], vq.shape[-1]
    # Backward programs: no attention of a value on itself and at least 2 keys. Softmax is then
    # one-hot (q . q dominates over a long head size; one key), dQ and dK are 0 in exact
    # arithmetic, and the flash backward's P (dP - delta) leaves rounding noise that grows with the
    # head size (docs/attention.md) where eager's math gives exactly 0.
    if g.flag(3) and not g.cfg.grad:
        k = v = q  # self-attention on one value
        s = length
        bound = vq.bound
    else:
        s = g.choice((5, 2, 16, 7, 64)) if g.cfg.grad else g.choice((5, 1, 16, 7, 64))
        k = weight(g, (*batch, s, e), vq.dtype)
        v = weight(g, (*batch, s, g.choice((e, 8, 3))), vq.dtype)
        bound = 4.5
    if s == 0:
        return None  # rows of no keys: vfuse gives 0 where eager gives NaN (documented)
    srcs = [q, k, v]
    causal = False
    mask = g.choice(("none", "none", "float", "bool", "causal"))
    if mask == "float":
        srcs.append(weight(g, (length, s), vq.dtype))
    elif mask == "bool":
        srcs.append(g.fresh((length, s), torch.bool, values=Values.ROW_MASK))
    causal = mask == "causal"
    scale = g.choice((None, 0.3))
    return g.add(Step(Kind.SDPA, None, tuple(srcs), (causal, scale)), bound, False)
