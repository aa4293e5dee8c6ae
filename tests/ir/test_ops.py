"""Every Op has exactly one definition, and each definition's rules agree with its reference."""

from __future__ import annotations

import pytest
import torch

from vfuse.interp import run
from vfuse.ir import DType, GraphBuilder, Kind, Op, TensorType, all_opdefs, opdef, verify


def test_every_op_is_defined_once() -> None:
    defs = all_opdefs()
    assert set(defs) == set(Op)
    assert all(d.op is op for op, d in defs.items())


def test_kinds_form_the_documented_lattice() -> None:
    order = [Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE, Kind.REDUCE, Kind.CONTRACTION, Kind.OPAQUE]
    assert order == sorted(order)
    assert opdef(Op.EXP).kind is Kind.ELEMENTWISE
    assert opdef(Op.EXPAND).kind is Kind.BROADCAST
    assert opdef(Op.PERMUTE).kind is Kind.INJECTIVE
    assert opdef(Op.SUM).kind is Kind.REDUCE
    assert opdef(Op.MATMUL).kind is Kind.CONTRACTION
    assert opdef(Op.OPAQUE).kind is Kind.OPAQUE


UNARY_FLOAT = [op for op, d in all_opdefs().items() if d.kind is Kind.ELEMENTWISE and d.arity == 1 and not d.attrs]


def _accepts(op: Op, dtype: DType) -> bool:
    try:
        opdef(op).infer((TensorType((1,), dtype),), {})  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("op", [op for op in UNARY_FLOAT if op is not Op.RAND], ids=lambda o: o.value)
def test_unary_type_rule_matches_reference(op: Op) -> None:
    """The inferred type must be exactly what the reference produces (shape and dtype)."""
    dtype = next(dt for dt in (DType.F32, DType.I32) if _accepts(op, dt))
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((3, 5), dtype))
    y = b.add(op, [x])
    g = verify(b.build([y]))
    (out,) = run(g, [(torch.rand(3, 5) * 0.9 + 0.05).to(dtype.torch)])
    assert TensorType.of(out) == g[y].type


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [((4, 1), (1, 5), (4, 5)), ((3,), (2, 3), (2, 3)), ((), (2, 2), (2, 2)), ((0, 3), (1, 3), (0, 3))],
)
def test_binary_broadcast_rule(a: tuple, b: tuple, expected: tuple) -> None:
    g = GraphBuilder()
    x = g.add(Op.INPUT, index=0, type=TensorType(a, DType.F32))
    y = g.add(Op.INPUT, index=1, type=TensorType(b, DType.F32))
    z = g.add(Op.ADD, [x, y])
    graph = verify(g.build([z]))
    assert graph[z].type.shape == expected
    (out,) = run(graph, [torch.randn(a), torch.randn(b)])
    assert tuple(out.shape) == expected


def test_bad_types_fail_when_the_node_is_built_and_name_it() -> None:
    g = GraphBuilder()
    x = g.add(Op.INPUT, index=0, type=TensorType((4, 3), DType.F32))
    y = g.add(Op.INPUT, index=1, type=TensorType((4, 3), DType.I32))
    with pytest.raises(TypeError, match=r"add\(%input: f32\[4,3\], %input_1: i32\[4,3\]\)"):
        g.add(Op.ADD, [x, y])
    w = g.add(Op.INPUT, index=2, type=TensorType((5, 2), DType.F32))
    with pytest.raises(ValueError, match="inner dims"):
        g.add(Op.MATMUL, [x, w], origin="mm_1")


def test_flops_and_bytes_of_a_matmul() -> None:
    d = opdef(Op.MATMUL)
    a, b = TensorType((8, 16), DType.F32), TensorType((16, 4), DType.F32)
    out = d.infer((a, b), {})  # type: ignore[arg-type]
    assert d.flops((a, b), out, {}) == 2 * 8 * 16 * 4  # type: ignore[arg-type]
    assert d.bytes((a, b), out, {}) == 4 * (8 * 16 + 16 * 4 + 8 * 4)  # type: ignore[arg-type]
