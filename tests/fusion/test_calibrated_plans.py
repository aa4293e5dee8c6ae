"""Plans on a calibrated target (explicit figures, not the machine's): a contraction's calibrated
overheads (`cost.template_extra_s`, `attention_extra_s`) are priced the same whether the planner costs
its kernel from summaries (GEMM + epilogue) or from nodes (with a prologue), so merges into it are
scored on what they change, not on that difference."""

from __future__ import annotations

import dataclasses

import pytest
from tests.fusion.fusion_patterns import FIXED_CPU, check_plan

from vfuse.fusion import estimate, plan_fusion
from vfuse.fusion.groups import KernelTable
from vfuse.fusion.legality import Budgets
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, verify

F32 = DType.F32
# FIXED_CPU with the calibrated GEMM figures of a Zen 4 at the avx2 tier (2026-12-03: 1.45e-10 s per
# element, 0.6 us per call; torch's 0.95e-10, 1.7 us) and a calibrated attention task.
CALIBRATED = dataclasses.replace(
    FIXED_CPU,
    contraction_elem_s=1.45e-10,
    contraction_call_s=6e-7,
    library_elem_s=0.95e-10,
    library_call_s=1.7e-6,
    library_f32=0.93 * FIXED_CPU.peak_f32,
    attention_task_s=2.3e-6,
    serial_launch_s=4e-8,
)


def qlinear(m: int = 2048, k: int = 256, n: int = 512) -> Graph:
    """int8 activations and weights: (x - zp) * s @ (w * ws)^T + bias -> gelu -> quantized back."""
    b = GraphBuilder()
    q = b.add(Op.INPUT, name="q", index=0, type=TensorType((m, k), DType.I8))
    w = b.add(Op.INPUT, name="w", index=1, type=TensorType((n, k), DType.I8))
    ws = b.add(Op.INPUT, name="ws", index=2, type=TensorType((n, 1), F32))
    bias = b.add(Op.INPUT, name="bias", index=3, type=TensorType((n,), F32))

    def full(name: str, value: float) -> str:
        return b.add(Op.FULL, name=name, value=value, shape=(), dtype=F32)

    zp, s = full("zp", 2.0), full("s", 0.02)  # shared by the dequantize and the quantize
    x = b.add(Op.CAST, (q,), name="x", dtype=F32)
    deq = b.add(Op.MUL, (b.add(Op.SUB, (x, zp), name="sub_zp"), s), name="deq")
    wf = b.add(Op.MUL, (b.add(Op.CAST, (w,), name="wf", dtype=F32), ws), name="wdeq")
    wt = b.add(Op.PERMUTE, (wf,), name="wt", perm=(1, 0))
    mm = b.add(Op.MATMUL, (deq, wt), name="mm")
    h = b.add(Op.GELU, (b.add(Op.ADD, (mm, bias), name="bias_add"),), name="gelu", approximate="none")
    r = b.add(Op.ROUND, (b.add(Op.DIV, (h, s), name="div_s"),), name="round")
    lo = b.add(Op.MAXIMUM, (b.add(Op.ADD, (r, zp), name="add_zp"), full("qmin", -128.0)), name="lo")
    out = b.add(Op.CAST, (b.add(Op.MINIMUM, (lo, full("qmax", 127.0)), name="hi"),), name="out", dtype=DType.I8)
    return verify(b.build([out]))


def attention_relu(bh: int = 8, t: int = 64, d: int = 32) -> Graph:
    b = GraphBuilder()
    q, k, v = (b.add(Op.INPUT, name=n, index=i, type=TensorType((bh, t, d), F32)) for i, n in enumerate("qkv"))
    a = b.add(Op.SDPA, (q, k, v), name="sdpa", scale=None, causal=False, gqa=False)
    return verify(b.build([b.add(Op.RELU, (a,), name="relu")]))


@pytest.mark.parametrize("target", [FIXED_CPU, CALIBRATED], ids=["uncalibrated", "calibrated"])
def test_quantized_linear_is_one_kernel_on_a_calibrated_target(target: object) -> None:
    """qlinear's dequantizes (activations and weights), its scalars and its quantizing epilogue join the
    GEMM. Calibrated, the scalars and the weight's dequantize stayed out (3 kernels): the GEMM + epilogue
    (costed from summaries) lacked the template's overheads that the exact cost of it with one more
    prologue node has, so every prologue merge was scored as losing ~1 ms."""
    graph = qlinear()
    plan = plan_fusion(graph, target)
    check_plan(plan)
    assert [g.label for g in plan.groups] == ["gemm"]
    assert plan.groups[0].cost.template_s == pytest.approx(estimate(plan.groups[0].nodes, graph, target).template_s)


@pytest.mark.parametrize("build", [qlinear, attention_relu])
def test_summary_cost_of_a_contraction_kernel_is_its_exact_cost(build: object) -> None:
    """The planner's cost of a contraction + epilogue kernel from summaries equals the exact cost of its
    nodes on a calibrated target: time, the template's and the library's overheads."""
    graph = build()  # type: ignore[operator]
    table = KernelTable(graph, CALIBRATED, Budgets())
    contraction = next(n for n in graph.compute_nodes if n.op in (Op.MATMUL, Op.SDPA))
    epilogue = graph[next(iter(graph.users(contraction.name)))]
    c, e = table.seed([contraction]), table.seed([epilogue])
    merged = table.build(c, e)
    exact = estimate([contraction.name, epilogue.name], graph, CALIBRATED)
    assert exact.template_s > 0 or build is attention_relu
    assert merged.cost.time_s == pytest.approx(exact.time_s, rel=1e-9)
    assert merged.cost.template_s == pytest.approx(exact.template_s)
    assert merged.cost.library_extra_s == pytest.approx(exact.library_extra_s)
