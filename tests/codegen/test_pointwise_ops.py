"""Every pointwise op of the Op table, natively, against the reference executor.

One graph per dtype family (one translation unit each) keeps the number of compiles low.
"""

from __future__ import annotations

import pytest
import torch
from tests.codegen.native_helpers import check, executor, inputs, scalar

from vfuse.ir import DType, GraphBuilder, Op, all_opdefs
from vfuse.ir.defs import rules

SHAPE = (37, 29)  # odd sizes exercise the SIMD loop remainders

# Ops whose domain is (0, 1) use x in [0.05, 0.95]; the rest read y in [-3, 3].
UNIT_DOMAIN = {Op.ASIN, Op.ACOS, Op.ATANH, Op.LOG, Op.LOG2, Op.LOG10, Op.SQRT, Op.RSQRT}


def float_unary_ops() -> list[Op]:
    return [op for op, d in all_opdefs().items() if d.arity == 1 and d.infer is rules.float_unary and not d.attrs]


def float_graph(dtype: DType) -> tuple:
    b = GraphBuilder()
    x, y, z = inputs(b, (SHAPE, dtype), (SHAPE, dtype), (SHAPE[1:], dtype))
    outs = []
    for op in float_unary_ops():
        if op is Op.ACOSH:
            outs.append(b.add(op, [b.add(Op.ADD, [x, scalar(b, 1.0, dtype)])]))
        else:
            outs.append(b.add(op, [x if op in UNIT_DOMAIN else y]))
    # torch itself disagrees between its scalar and vector paths on gelu(+-inf): no specials here
    outs += [b.add(Op.GELU, [z], approximate=a) for a in ("none", "tanh")]
    for op in (Op.NEG, Op.ABS, Op.RELU, Op.SIGN, Op.ISNAN, Op.ISINF, Op.LOGICAL_NOT):
        outs.append(b.add(op, [y]))
    for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAXIMUM, Op.MINIMUM, Op.ATAN2, Op.FLOOR_DIV, Op.REMAINDER, Op.FMOD):
        outs.append(b.add(op, [y, z]))  # z broadcasts along rows
    outs.append(b.add(Op.POW, [x, y]))
    for op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR):
        outs.append(b.add(op, [y, z]))
    outs.append(b.add(Op.WHERE, [b.add(Op.GT, [y, z]), y, z]))
    iota = b.add(Op.IOTA, length=SHAPE[1], start=0.5, step=0.25, dtype=dtype)
    outs.append(b.add(Op.MUL, [y, iota]))
    return b.build(outs), (x, y, z)


def float_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(SHAPE, generator=g) * 0.9 + 0.05
    y = torch.rand(SHAPE, generator=g) * 6 - 3
    z = torch.rand(SHAPE[1:], generator=g) * 4 - 2
    z[z.abs() < 0.1] = 0.5  # keep divisors away from 0
    y[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return [x.to(dtype), y.to(dtype), z.to(dtype)]


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(DType.F32, 1e-5), (DType.F64, 1e-10), (DType.F16, 2e-3), (DType.BF16, 1.6e-2)],
)
def test_float_ops(dtype: DType, tol: float) -> None:
    graph, _ = float_graph(dtype)
    xs = float_inputs(dtype.torch)
    check(graph, xs, rtol=tol, atol=tol)


def test_gelu_forms_against_eager() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((4096,), DType.F32))
    g = b.build([b.add(Op.GELU, [x], approximate="none"), b.add(Op.GELU, [x], approximate="tanh")])
    xs = [torch.linspace(-8, 8, 4096)]
    ex = check(g, xs)
    got = ex(xs)
    torch.testing.assert_close(got[0], torch.nn.functional.gelu(xs[0]))
    torch.testing.assert_close(got[1], torch.nn.functional.gelu(xs[0], approximate="tanh"))


INT_DTYPES = [DType.I8, DType.U8, DType.I16, DType.I32, DType.I64]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_int_ops(dtype: DType) -> None:
    b = GraphBuilder()
    x, y = inputs(b, (SHAPE, dtype), (SHAPE[1:], dtype))
    outs = [b.add(op, [x]) for op in (Op.NEG, Op.ABS, Op.RELU, Op.SIGN, Op.BITWISE_NOT, Op.LOGICAL_NOT)]
    binary = (Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM, Op.MINIMUM, Op.FLOOR_DIV, Op.REMAINDER, Op.FMOD)
    outs += [b.add(op, [x, y]) for op in binary]
    outs += [b.add(op, [x, y]) for op in (Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.EQ, Op.LT, Op.GE)]
    outs.append(b.add(Op.POW, [x, b.add(Op.FULL, value=3, shape=(), dtype=dtype)]))
    outs.append(b.add(Op.IOTA, length=SHAPE[1], start=3, step=2, dtype=dtype))
    graph = b.build(outs)
    g = torch.Generator().manual_seed(1)
    lo = 0 if dtype is DType.U8 else -100
    x = torch.randint(lo, 100, SHAPE, generator=g, dtype=dtype.torch)
    y = torch.randint(1, 50, SHAPE[1:], generator=g, dtype=dtype.torch)
    if dtype is not DType.U8:
        y[::2] *= -1
    check(graph, [x, y], rtol=0, atol=0)


def test_bool_ops() -> None:
    b = GraphBuilder()
    x, y = inputs(b, (SHAPE, DType.BOOL), (SHAPE, DType.BOOL))
    outs = [b.add(op, [x, y]) for op in (Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR, Op.BITWISE_XOR, Op.EQ)]
    outs += [b.add(Op.LOGICAL_NOT, [x]), b.add(Op.BITWISE_NOT, [x]), b.add(Op.WHERE, [x, y, x])]
    graph = b.build(outs)
    g = torch.Generator().manual_seed(2)
    check(graph, [torch.rand(SHAPE, generator=g) > 0.5, torch.rand(SHAPE, generator=g) > 0.5], rtol=0, atol=0)


def test_round_half_to_even_and_casts() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((64,), DType.F32))
    outs = [b.add(op, [x]) for op in (Op.ROUND, Op.FLOOR, Op.CEIL, Op.TRUNC)]
    outs += [b.add(Op.CAST, [x], dtype=d) for d in (DType.I32, DType.I8, DType.BOOL, DType.F16, DType.BF16, DType.F64)]
    graph = b.build(outs)
    x = torch.arange(-32, 32, dtype=torch.float32) * 0.5 + torch.tensor([0.0, 1e-3] * 32)
    check(graph, [x], rtol=0, atol=0)


def test_fast_erf_accuracy_over_the_whole_range() -> None:
    # vf_erf is a rational approximation: bound its error against float64 on a dense grid.
    b = GraphBuilder()
    (x,) = inputs(b, ((1 << 20,), DType.F32))
    graph = b.build([b.add(Op.ERF, [x]), b.add(Op.GELU, [x], approximate="none")])
    xs = torch.linspace(-6, 6, 1 << 20)
    erf, gelu = executor(graph)([xs])
    exact = torch.erf(xs.double())
    assert (erf.double() - exact).abs().max() < 5e-7
    assert ((erf.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max() < 5e-7
    assert (erf.double() - exact).abs().max() < 20 * (torch.erf(xs).double() - exact).abs().max()
    torch.testing.assert_close(gelu, torch.nn.functional.gelu(xs), rtol=1e-5, atol=2e-6)
