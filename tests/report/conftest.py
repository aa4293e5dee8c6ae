"""A small hand-built graph and fusion plan (GEMM + epilogue, a softmax row kernel, a torch
fallback) so the report is tested without torch capture or the real planner."""

from __future__ import annotations

import pytest
import torch

from vfuse.fusion.plan import Cost, Decision, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.ir import ConstValue, DType, Graph, GraphBuilder, Kind, Op, TensorType
from vfuse.ir.opaque import ArgSlot, OpaqueCall


def build_graph() -> Graph:
    b = GraphBuilder()
    f32 = DType.F32
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((64, 256), f32))
    w = b.add(Op.INPUT, name="w", index=1, type=TensorType((256, 256), f32))
    bias = b.add(Op.CONSTANT, name="bias", value=ConstValue(torch.zeros(256)))
    mm = b.add(Op.MATMUL, [x, w], name="mm")
    be = b.add(Op.EXPAND, [bias], name="bias_b", shape=(64, 256))
    y = b.add(Op.ADD, [mm, be], name="y")
    g = b.add(Op.GELU, [y], name="g", approximate="none")
    m = b.add(Op.AMAX, [g], name="m", axes=(1,), keepdim=True)
    s = b.add(Op.SUB, [g, m], name="s")
    e = b.add(Op.EXP, [s], name="e")
    z = b.add(Op.SUM, [e], name="z", axes=(1,), keepdim=True)
    o = b.add(Op.DIV, [e, z], name="o")
    call = OpaqueCall(torch.flip, (ArgSlot(0), [1]))
    f = b.add(Op.OPAQUE, [o], name="flip", call=call, out_type=TensorType((64, 256), f32))
    return b.build([f, m])


def cost(time_s: float, nbytes: int, flops: int = 1000, compute_s: float = 1e-7, memory_s: float = 2e-7) -> Cost:
    return Cost(flops, nbytes, compute_s, memory_s, 2e-6, time_s, 0.5, 4.0)


GROUPS = (
    Group(
        0,
        ("mm", "bias_b", "y", "g"),
        Kind.CONTRACTION,
        "gemm",
        ("x", "w", "bias"),
        ("g",),
        cost(8e-6, 65536 + 262144 + 1024 + 65536, flops=8_388_608, compute_s=5e-6, memory_s=1e-6),
    ),
    Group(1, ("m", "s", "e", "z", "o"), Kind.REDUCE, "row", ("g",), ("m", "o"), cost(3e-6, 65536 * 2 + 256)),
    Group(2, ("flip",), Kind.OPAQUE, "opaque", ("o",), ("flip",), cost(4e-6, 65536 * 2)),
)

DECISIONS = (
    Decision(("bias_b",), ("y",), True, Rule.VIEW_INDEX_MAP, "index map", 1.5e-6),
    Decision(("y",), ("g",), True, Rule.ELEMENTWISE_INTO_ANY, "saves a round trip", 2e-6),
    Decision(("mm",), ("y", "g", "bias_b"), True, Rule.EPILOGUE_AFTER_CONTRACTION, "GEMM epilogue", 3e-6),
    Decision(("g",), ("m",), False, Rule.CONTRACTION_WITH_REDUCTION, "GEMM tile does not own full rows", None),
    Decision(("m",), ("s",), True, Rule.MULTI_PASS_ROW, "row kernel", 1e-6),
    Decision(("s",), ("e",), True, Rule.ELEMENTWISE_INTO_ANY, "", 1e-6),
    Decision(("e",), ("z", "o"), True, Rule.PROLOGUE_INTO_REDUCTION, "softmax row", 2e-6),
    Decision(("o",), ("flip",), False, Rule.OPAQUE_ALONE, "torch fallback cannot fuse", None),
)


def build_plan(graph: Graph) -> FusionPlan:
    return FusionPlan(graph, "h100", GROUPS, DECISIONS)


# Graphs and plans are immutable, so one instance serves every test.
@pytest.fixture(scope="session")
def graph() -> Graph:
    return build_graph()


@pytest.fixture(scope="session")
def plan(graph: Graph) -> FusionPlan:
    return build_plan(graph)


def build_recompute() -> tuple[Graph, FusionPlan]:
    """x -> n = neg(x) read by a = exp(n) and b = sin(n); the planner recomputes n in both kernels."""
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((1024,), DType.F32))
    n = b.add(Op.NEG, [x], name="n")
    a = b.add(Op.EXP, [n], name="a")
    s = b.add(Op.SIN, [n], name="s")
    graph = b.build([a, s])
    groups = (
        Group(0, ("n", "a"), Kind.ELEMENTWISE, "pointwise", ("x",), ("a",), cost(3e-6, 8192)),
        Group(1, ("n", "s"), Kind.ELEMENTWISE, "pointwise", ("x",), ("s",), cost(3e-6, 8192)),
    )
    decisions = (Decision(("n",), ("a", "s"), True, Rule.RECOMPUTE_INTO_CONSUMERS, "cheap producer", 2e-6),)
    return graph, FusionPlan(graph, "cpu", groups, decisions)


@pytest.fixture(scope="session")
def recompute() -> tuple[Graph, FusionPlan]:
    return build_recompute()


def build_two_shapes() -> tuple[Graph, FusionPlan]:
    """One planner group whose outputs differ in shape: code generation runs one nest per shape."""
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((8, 16), DType.F32))
    y = b.add(Op.INPUT, name="y", index=1, type=TensorType((16,), DType.F32))
    a = b.add(Op.EXP, [x], name="a")
    c = b.add(Op.NEG, [y], name="c")
    graph = b.build([a, c])
    group = Group(0, ("a", "c"), Kind.ELEMENTWISE, "pointwise", ("x", "y"), ("a", "c"), cost(9.0, 1))
    return graph, FusionPlan(graph, "cpu", (group,), ())


@pytest.fixture(scope="session")
def two_shapes() -> tuple[Graph, FusionPlan]:
    return build_two_shapes()
