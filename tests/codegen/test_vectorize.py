"""Performance guard: every loop the renderer marks `omp simd` is really vectorized by g++."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import executor, hand_plan, inputs, scalar
from tests.codegen.vectorization import simd_loops_vectorized

from vfuse.ir import DType, GraphBuilder, Op
from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa


def _pointwise_graph() -> object:
    b = GraphBuilder()
    x, y, q = inputs(b, ((4096,), DType.F32), ((4096,), DType.F32), ((4096,), DType.I8))
    o = b.add(
        Op.ADD, [b.add(Op.MUL, [b.add(Op.RELU, [b.add(Op.ADD, [x, y])]), scalar(b, 0.5)]), b.add(Op.SIGMOID, [x])]
    )
    g = b.add(Op.GELU, [b.add(Op.MUL, [b.add(Op.CAST, [q], dtype=DType.F32), scalar(b, 0.05)])], approximate="none")
    qo = b.add(Op.CAST, [b.add(Op.ROUND, [b.add(Op.DIV, [g, scalar(b, 0.05)])])], dtype=DType.I8)
    return b.build([o, qo])


def _gather_graph() -> object:
    """An embedding: its index check (the prelude's vf_check_rows) is instantiated."""
    b = GraphBuilder()
    table, idx = inputs(b, ((50, 64), DType.F32), ((4096,), DType.I64))
    return b.build([b.add(Op.RELU, [b.add(Op.EMBEDDING, [table, idx])])])


@pytest.mark.parametrize("kind", ["pointwise", "gather", "layernorm", "softmax"])
def test_simd_loops_vectorize(kind: str, tmp_path: Path) -> None:
    if kind in ("pointwise", "gather"):
        graph = _pointwise_graph() if kind == "pointwise" else _gather_graph()
        plan = None
    else:
        graph, _ = norm_graph(kind, 64, 256)
        plan = hand_plan(graph, [[n.name for n in graph.compute_nodes]])
    source = executor(graph, plan).source
    simd, vectorized = simd_loops_vectorized(source, tmp_path)
    if isa_for(None).tier is Isa.GENERIC:
        # SSE2 has no 32- or 64-bit integer min/max: the index range check (vf_check_rows) stays scalar.
        lines = source.splitlines()
        vectorized |= {p for p in simd if "reduction(min:" in lines[p - 1]}
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"
