"""Pointwise lowerings against eager: unary math, binary ops with scalars, broadcasting and
mixed dtypes, comparisons, logic, where, clamps, activations and casts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import check, ops_of

from vfuse.ir import Op


def _inputs(domain: str) -> tuple[torch.Tensor, ...]:
    """A scalar, a zero-size, a size-1-dim and a non-contiguous input in the op's domain."""
    g = torch.Generator().manual_seed(0)
    make = {
        "real": lambda *s: torch.randn(*s, generator=g) * 3,
        "pos": lambda *s: torch.rand(*s, generator=g) * 4 + 0.05,
        "unit": lambda *s: torch.rand(*s, generator=g) * 1.8 - 0.9,
        "ge1": lambda *s: torch.rand(*s, generator=g) * 4 + 1,
    }[domain]
    return make(()), make(0, 3), make(5, 1, 3), make(4, 6).t()


UNARY: list[tuple[str, Callable, str]] = [
    ("exp", torch.exp, "real"), ("exp2", torch.exp2, "real"), ("expm1", torch.expm1, "real"),
    ("log", torch.log, "pos"), ("log2", torch.log2, "pos"), ("log10", torch.log10, "pos"),
    ("log1p", torch.log1p, "pos"), ("sqrt", torch.sqrt, "pos"), ("rsqrt", torch.rsqrt, "pos"),
    ("sin", torch.sin, "real"), ("cos", torch.cos, "real"), ("tan", torch.tan, "unit"),
    ("asin", torch.asin, "unit"), ("acos", torch.acos, "unit"), ("atan", torch.atan, "real"),
    ("sinh", torch.sinh, "real"), ("cosh", torch.cosh, "real"), ("tanh", torch.tanh, "real"),
    ("asinh", torch.asinh, "real"), ("acosh", torch.acosh, "ge1"), ("atanh", torch.atanh, "unit"),
    ("erf", torch.erf, "real"), ("erfc", torch.erfc, "real"), ("sigmoid", torch.sigmoid, "real"),
    ("relu", torch.relu, "real"), ("silu", F.silu, "real"), ("reciprocal", torch.reciprocal, "pos"),
    ("floor", torch.floor, "real"), ("ceil", torch.ceil, "real"), ("round", torch.round, "real"),
    ("trunc", torch.trunc, "real"), ("neg", torch.neg, "real"), ("abs", torch.abs, "real"),
    ("sign", torch.sign, "real"), ("gelu", F.gelu, "real"),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "real"),
    ("isnan", torch.isnan, "real"), ("isinf", torch.isinf, "real"), ("isfinite", torch.isfinite, "real"),
    ("logical_not", torch.logical_not, "real"), ("square", torch.square, "real"), ("hardtanh", F.hardtanh, "real"),
    ("relu6", F.relu6, "real"), ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), "real"),
    ("threshold", lambda x: F.threshold(x, 0.5, -2.0), "real"), ("elu", F.elu, "real"),
    ("hardswish", F.hardswish, "real"), ("softplus", F.softplus, "real"), ("frac", torch.frac, "real"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn", "domain"), UNARY, ids=[u[0] for u in UNARY])
def test_unary(name: str, fn: Callable, domain: str) -> None:
    check(lambda *xs: tuple(fn(x) for x in xs), *_inputs(domain))


@pytest.mark.parametrize("op", [torch.exp, torch.sigmoid, torch.abs, torch.neg, torch.floor, torch.sqrt])
def test_unary_on_ints_promotes_like_torch(op: Callable) -> None:
    x = torch.arange(-3, 9, dtype=torch.int32).reshape(3, 4)
    check(lambda x: op(x), x if op is not torch.sqrt else x.abs())


def test_nan_and_inf_pass_through_like_torch() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 2.0])
    check(lambda x: (F.relu(x), torch.isfinite(x), F.hardtanh(x), F.leaky_relu(x), torch.sign(x), x.clamp(0, 1)), x)


def _binary_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 1, 5, generator=g) * 4
    b = torch.randn(4, 1, generator=g).abs() * 3 + 0.5  # broadcasts against a; nonzero divisor
    i = torch.randint(-9, 10, (3, 4, 5), generator=g, dtype=torch.int32)
    j = torch.randint(1, 6, (5,), generator=g, dtype=torch.int64)
    h = (torch.randn(4, 5, generator=g) * 4).half()
    return a, b, i, j, h


BINARY: list[tuple[str, Callable]] = [
    ("add", torch.add), ("add_alpha", lambda a, b: torch.add(a, b, alpha=2)), ("sub", torch.sub),
    ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=3)), ("mul", torch.mul), ("div", torch.div),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")), ("floor_divide", torch.floor_divide),
    ("remainder", torch.remainder), ("fmod", torch.fmod), ("maximum", torch.maximum), ("minimum", torch.minimum),
    ("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge),
    ("logical_and", torch.logical_and), ("logical_or", torch.logical_or), ("logical_xor", torch.logical_xor),
    ("atan2", torch.atan2), ("rsub", lambda a, b: torch.rsub(a, b)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "op"), BINARY, ids=[b[0] for b in BINARY])
def test_binary(name: str, op: Callable) -> None:
    """Broadcast float-float, float-scalar, int-int, int-float promotion and half-float mixes."""

    # Some torch functions take no python scalar; they get 0-dim tensors (graph constants) instead.
    tensor_only = name in ("maximum", "minimum", "logical_and", "logical_or", "logical_xor", "atan2")

    def s(v: float) -> float | torch.Tensor:
        return torch.tensor(v) if tensor_only else v

    def fn(a: torch.Tensor, b: torch.Tensor, i: torch.Tensor, j: torch.Tensor, h: torch.Tensor) -> tuple:
        outs = [op(a, b), op(a, s(2.5)), op(a[0].t(), b[:1, :1]), op(i, j), op(i, s(3)), op(h, b[:, :1]), op(h, s(2))]
        return (*outs, op(i, b[:, :1].reshape(1, 4, 1)), op(a[:0], b), op(i[:, :1], j))  # zero-size, size-1

    check(fn, *_binary_inputs(), rtol=1e-3, atol=1e-3)


def test_pow_forms() -> None:
    a, b = torch.rand(3, 4) + 0.5, torch.rand(4) * 2
    i = torch.randint(0, 4, (3, 4))
    check(lambda a, b, i: (a**b, a**2, a**0.5, 2**a, i**2, i**b, a ** i.float()), a, b, i)


@pytest.mark.parametrize("op", [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor])
def test_bitwise(op: Callable) -> None:
    i = torch.randint(-50, 50, (3, 4), dtype=torch.int32)
    j = torch.randint(-50, 50, (4,), dtype=torch.int64)
    m, n = torch.rand(3, 4) > 0.5, torch.rand(3, 4) > 0.3
    check(lambda i, j, m, n: (op(i, j), op(i, 7), op(m, n), ~i, ~m), i, j, m, n)


def test_integer_trunc_division_of_negatives() -> None:
    a = torch.tensor([-7, -6, -1, 0, 1, 6, 7], dtype=torch.int64)
    b = torch.tensor([2, -2, 3, -3, 2, 4, -4], dtype=torch.int64)
    check(lambda a, b: (torch.div(a, b, rounding_mode="trunc"), a // b, a % b, torch.fmod(a, b)), a, b)


def test_where_forms() -> None:
    c = torch.rand(3, 1, 4) > 0.5
    a, b = torch.randn(2, 4), torch.randn(3, 2, 1)
    i = torch.randint(0, 9, (3, 2, 4), dtype=torch.int32)
    check(lambda c, a, b, i: (torch.where(c, a, b), torch.where(c, a, 0.0), torch.where(c, 1.0, b),
                              torch.where(c, i, a), torch.where(c, i, 2)), c, a, b, i)  # fmt: skip


def test_masked_fill() -> None:
    x, m = torch.randn(3, 4), torch.rand(4) > 0.5
    check(lambda x, m: (x.masked_fill(m, -1e9), x.masked_fill(m, torch.tensor(2.0))), x, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_clamp_scalar_and_tensor_bounds(dtype: torch.dtype) -> None:
    x = (torch.randn(3, 5) * 5).to(dtype)
    lo, hi = torch.full((5,), -1).to(dtype), (torch.rand(3, 1) * 3).to(dtype)
    check(lambda x, lo, hi: (x.clamp(-2, 3), x.clamp(min=0), x.clamp(max=1), x.clamp(lo, hi), x.clamp(min=lo),
                             torch.clamp_max(x, hi), torch.clamp_min(x, 1), x.clamp(-1.5, 1.5)), x, lo, hi)  # fmt: skip


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_casts(src: torch.dtype) -> None:
    x = (torch.randn(4, 5) * 50).to(src)
    graph = check(lambda x: (*(x.to(d) for d in DTYPES), x.float().half(), x.type(torch.int32)), x)
    assert ops_of(graph)[Op.CAST] >= len(DTYPES) - 1


def test_scalar_broadcasting_uses_shape0_full() -> None:
    graph = check(lambda x: x * 2 + 1, torch.randn(2, 3))
    fulls = [n for n in graph.nodes if n.op is Op.FULL]
    assert fulls and all(n.type.shape == () for n in fulls)


def test_compare_int_tensor_with_float_scalar_promotes() -> None:
    i = torch.tensor([1, 2, 3])
    check(lambda i: (i > 1.5, i == 2.0, i < 2), i)
