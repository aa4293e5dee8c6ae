"""The op builders of the fuzz generator: one per step kind, each drawing operands and params.

A builder returns the index of the value it added, or None (the generator then rolls back the
fresh inputs it made). Bounds are rough magnitudes (see graphs.py); `exact` follows the rules
there: only exact values feed discontinuous ops, so those are compared bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st
from tests.fuzz import graphs_layout, graphs_nn
from tests.fuzz.graphs import FLOATS, INTS, Gen, Val, broadcastable
from tests.fuzz.ops import UNARY_FNS, A, B, R, S, U
from tests.fuzz.program import Kind, Step

DISCONTINUOUS_U = {U.FLOOR, U.CEIL, U.ROUND, U.TRUNC, U.SIGN, U.ISNAN, U.ISINF, U.ISFINITE, U.LOGICAL_NOT}
DISCONTINUOUS_U |= {U.BITWISE_NOT}
KEEPS_EXACT_U = {U.NEG, U.ABS, U.RELU, U.HARDTANH}
EXACT_INPUTS_B = {B.ATAN2, B.FLOOR_DIV, B.REMAINDER, B.FMOD, B.LOGICAL_AND, B.LOGICAL_OR, B.LOGICAL_XOR}
EXACT_INPUTS_B |= {B.EQ, B.NE, B.LT, B.LE, B.GT, B.GE, B.BITWISE_AND, B.BITWISE_OR, B.BITWISE_XOR}
EXP_LIKE = {U.EXP: math.e, U.EXP2: 2.0, U.EXPM1: math.e, U.SINH: math.e, U.COSH: math.e}
UNIT_BOUND_U = {U.SIGMOID, U.TANH, U.ERF, U.ERFC, U.SIN, U.COS, U.TAN, U.ATAN, U.ASIN, U.ACOS, U.ATANH}
UNIT_BOUND_U |= {U.RSQRT, U.RECIPROCAL, U.HARDSIGMOID, U.SIGN} | DISCONTINUOUS_U - {U.FLOOR, U.CEIL, U.ROUND, U.TRUNC}
REDUCED_PRECISION = (torch.float16, torch.bfloat16)


def _unary_bound(fn: U, b: float) -> float:
    if fn in EXP_LIKE:
        return EXP_LIKE[fn] ** min(b, 80.0)
    if fn in UNIT_BOUND_U:
        return 4.0
    if fn in (U.LOG, U.LOG2, U.LOG10, U.LOG1P, U.ACOSH, U.SQRT):
        return math.log2(b + 2) + math.sqrt(b) + 2
    return 1.1 * b + 1


def unary(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fns = [u for u in UNARY_FNS if v.exact or u not in DISCONTINUOUS_U]
    fn = g.choice(fns)
    exact = v.exact and (fn in KEEPS_EXACT_U or fn in DISCONTINUOUS_U)
    return g.add(Step(Kind.UNARY, fn, (x,)), _unary_bound(fn, v.bound), exact)


def _binary_bound(fn: B, a: Val, b: Val) -> float:
    if fn in (B.ADD, B.SUB):
        return a.bound + b.bound
    if fn is B.MUL:
        return a.bound * b.bound
    if fn in (B.DIV, B.FLOOR_DIV, B.MAXIMUM, B.MINIMUM):
        return max(a.bound, b.bound)
    if fn in (B.REMAINDER, B.FMOD):
        return b.bound + 1
    if fn is B.POW:
        return max(a.bound + 0.5, 2.0)
    if fn in (B.BITWISE_AND, B.BITWISE_OR, B.BITWISE_XOR):
        return 2 * max(a.bound, b.bound) + 1
    return 4.0


def _wraps(dtype: torch.dtype, bound: float) -> float:
    """8-bit integer arithmetic wraps around (defined); the bound is then the type's range."""
    return min(bound, 256.0) if dtype in (torch.int8, torch.uint8) else bound


def binary(g: Gen) -> int | None:
    a = g.pick(lambda v: True)
    if a is None:
        return None
    va = g.vals[a]
    b = g.pick(lambda v: broadcastable(v.shape, va.shape))
    vb = g.vals[b]  # type: ignore[index]
    both_exact = va.exact and vb.exact
    fns = [f for f in B if both_exact or f not in EXACT_INPUTS_B]
    if g.cfg.grad:
        fns = [f for f in fns if f is not B.FLOOR_DIV]  # no derivative in torch
    if any(v.dtype in REDUCED_PRECISION for v in (va, vb)):
        fns = [f for f in fns if f not in (B.FLOOR_DIV, B.REMAINDER, B.FMOD)]  # their divisor |b|+1 rounds
    fn = g.choice(fns)
    exact = both_exact and (fn in EXACT_INPUTS_B or fn in (B.MAXIMUM, B.MINIMUM) or not _any_float(va, vb))
    bound = _binary_bound(fn, va, vb)
    ints = not _any_float(va, vb)
    return g.add(Step(Kind.BINARY, fn, (a, b)), _wraps(_int_dtype(va, vb), bound) if ints else bound, exact)


def _any_float(*vals: Val) -> bool:
    return any(v.is_float for v in vals)


def _int_dtype(*vals: Val) -> torch.dtype:
    return torch.promote_types(vals[0].dtype, vals[-1].dtype)


SCALARS = {
    S.ADD: (0.5, -1.5, 2, -3, 1),
    S.MUL: (2, -1.5, 0.1, 3, -1),
    S.RSUB: (1, 0.5, -2),
    S.DIV: (2.0, -3.0, 0.7, 7),
    S.POW: (2, 3),
    S.ABS_POW: (0.5, -0.5, 1.5, -1.0, 2.5),
    S.CLAMP_MIN: (0, -1, 0.5),
    S.GT: (0, 0.5, -1, 1),
    S.EQ: (0, 1, -1),
    S.FULL_LIKE: (0.0, 1.5, -2, 7),
    S.ARANGE_ADD: (1, 0.5, -1),
    S.TRIU: (0, 1, -1, 2),
    S.TRIL: (0, 1, -1, 2),
}


def _scalar_bound(fn: S, b: float, s: float) -> float:
    if fn in (S.ADD, S.RSUB, S.CLAMP_MIN):
        return b + abs(s)
    if fn is S.MUL:
        return b * abs(s)
    if fn is S.DIV:
        return b / 0.7
    if fn is S.POW:
        return b**s
    if fn is S.ABS_POW:
        return max((b + 0.5) ** s, 2.0 ** abs(s))
    if fn is S.FULL_LIKE:
        return abs(s)
    if fn is S.ARANGE_ADD:
        return b + abs(s) * 300000
    return max(b, 1.0)


def scalar(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fns = [f for f in S if v.exact or f not in (S.GT, S.EQ)]
    if v.dtype in REDUCED_PRECISION:
        fns = [f for f in fns if f is not S.ARANGE_ADD]  # arange * s rounds differently in bf16
    fn = g.choice(fns)
    if fn is S.CLAMP:
        lo, hi = g.choice((-1, -0.5, 0, -2)), g.choice((0.5, 1, 2, 3))
        return g.add(Step(Kind.SCALAR, fn, (x,), (lo, hi)), max(v.bound, 3.0), v.exact)
    s = g.choice(SCALARS[fn])
    int_result = not v.is_float and isinstance(s, int) and fn not in (S.DIV, S.ABS_POW)
    keeps = fn in (S.CLAMP_MIN, S.TRIU, S.TRIL, S.FULL_LIKE, S.GT, S.EQ)
    exact = (v.exact and (keeps or int_result)) or fn is S.FULL_LIKE
    bound = _scalar_bound(fn, v.bound, s)
    return g.add(Step(Kind.SCALAR, fn, (x,), (s,)), _wraps(v.dtype, bound) if int_result else bound, exact)


ALL_DTYPES = (*FLOATS, *INTS, torch.bool)


def cast(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    targets = [d for d in ALL_DTYPES if d != v.dtype]
    if v.is_float:
        allowed_int = v.exact and not v.special and v.bound < 100
        targets = [d for d in targets if d.is_floating_point or d == torch.bool or (allowed_int and d != torch.uint8)]
    to = g.choice(targets)
    bound = 1.0 if to == torch.bool else _wraps(to, v.bound)
    return g.add(Step(Kind.CAST, None, (x,), (to,)), bound, v.exact)


def where(g: Gen) -> int | None:
    c = g.pick(lambda v: v.dtype == torch.bool and v.exact)
    if c is None:
        return None
    vc = g.vals[c]
    a = g.pick(lambda v: broadcastable(v.shape, vc.shape))
    va = g.vals[a]  # type: ignore[index]
    if g.flag(4):
        s = g.choice((0.0, -1.5, 2))
        return g.add(Step(Kind.WHERE, None, (c, a), (s,)), max(va.bound, 2.0), va.exact)  # type: ignore[arg-type]
    shape = torch.broadcast_shapes(vc.shape, va.shape)
    b = g.pick(lambda v: broadcastable(v.shape, shape))
    vb = g.vals[b]  # type: ignore[index]
    return g.add(Step(Kind.WHERE, None, (c, a, b)), max(va.bound, vb.bound), va.exact and vb.exact)  # type: ignore[arg-type]


def _dims(g: Gen, rank: int, single: bool) -> tuple[int, ...] | None:
    if rank == 0 or g.flag(5):
        return None
    if single:
        d = g.draw(st.integers(0, rank - 1))
        return (d - rank if g.flag(3) else d,)
    dims = [d for d in range(rank) if g.flag()] or [g.draw(st.integers(0, rank - 1))]
    return tuple(d - rank if g.flag(4) else d for d in dims)


def _reduce_bound(fn: R, b: float, n: int) -> float:
    if fn is R.SUM:
        return n * b
    if fn is R.VAR:
        return 2 * b * b
    if fn is R.PROD:
        return math.inf if n * math.log(max(b, 1.0)) > 40 else max(b, 1.0) ** n
    if fn is R.LOGSUMEXP:
        return b + math.log(n + 1)
    if fn is R.NORM2:
        return math.sqrt(n) * b
    return 1.5 * b + 1


def reduce(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fn = g.choice([f for f in R if v.exact or f not in (R.ANY, R.ALL)])
    dims = _dims(g, len(v.shape), single=fn in (R.PROD, R.ANY, R.ALL))
    return add_reduce(g, x, fn, dims, g.flag())


def add_reduce(g: Gen, x: int, fn: R, dims: tuple[int, ...] | None, keepdim: bool) -> int | None:
    v = g.vals[x]
    n = math.prod(v.shape[d] for d in dims) if dims is not None else v.numel
    extra = g.draw(st.integers(0, 1)) if fn in (R.VAR, R.STD) else 0
    exact = v.exact and (fn in (R.AMAX, R.AMIN, R.ANY, R.ALL) or not v.is_float)
    bound = _reduce_bound(fn, v.bound, n)
    return g.add(Step(Kind.REDUCE, fn, (x,), (dims, keepdim, extra)), bound, exact)


def arg(g: Gen) -> int | None:
    fn = g.choice(list(A))
    needs_exact = fn in (A.ARGMAX, A.ARGMIN, A.MAX_INDICES)
    x = g.pick(lambda v: v.exact or not needs_exact)
    if x is None:
        return None
    v = g.vals[x]
    rank = len(v.shape)
    dim = None if (rank == 0 or g.flag(4)) and fn is not A.MAX_INDICES else g.draw(st.integers(0, max(rank - 1, 0)))
    bound = float(max(v.shape, default=1)) if needs_exact else v.bound
    return g.add(Step(Kind.ARG, fn, (x,), (dim, g.flag())), bound, v.exact)


BUILDERS: dict[Kind, Callable[[Gen], int | None]] = {
    Kind.UNARY: unary,
    Kind.BINARY: binary,
    Kind.SCALAR: scalar,
    Kind.CAST: cast,
    Kind.WHERE: where,
    Kind.REDUCE: reduce,
    Kind.ARG: arg,
    Kind.NORM: graphs_nn.norm,
    Kind.MATMUL: graphs_nn.matmul,
    Kind.LINEAR: graphs_nn.linear,
    Kind.CONV: graphs_nn.conv,
    Kind.POOL: graphs_nn.pool,
    Kind.SDPA: graphs_nn.sdpa,
    **graphs_layout.BUILDERS,
}
