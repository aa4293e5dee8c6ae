"""Streaming kernels (non-temporal stores for outputs larger than the LLC): results match the
reference executor for every shape of chunk (head and tail around 64-byte lines, int8 and
fp16 storage, broadcast loads, row kernels reloading a row buffer), and the schedule only
streams what is at least the LLC's size. A target with a tiny LLC makes small tests stream."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import hand_plan, inputs, scalar, target
from tests.codegen.vectorization import simd_loops_vectorized

from vfuse import interp
from vfuse.compiler import native_executor
from vfuse.context import Context, Options
from vfuse.fusion import FusionPlan, plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.runtime.native import NativeExecutor
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel


def _small_llc() -> object:
    return dataclasses.replace(target(), l3_bytes=4096)  # type: ignore[arg-type]


def _run(graph: Graph, xs: list[torch.Tensor], plan: FusionPlan | None = None) -> NativeExecutor:
    tgt = _small_llc()
    plan = plan or plan_fusion(graph, tgt)
    ex = native_executor(plan, tgt, Context(Options.from_env()))
    assert any(k.stream for k in ex.program.kernels if isinstance(k, Kernel)), ex.source
    for g, w in zip(ex(list(xs)), interp.run(graph, xs), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    return ex


def _quant_graph(n: int, d: int) -> Graph:
    """int8 -> dequant -> gelu -> requant -> int8 (the dequant_quant benchmark), plus an fp16 copy."""
    b = GraphBuilder()
    (q,) = inputs(b, ((n, d), DType.I8))
    x = b.add(Op.MUL, [b.add(Op.SUB, [b.add(Op.CAST, [q], dtype=DType.F32), scalar(b, 3.0)]), scalar(b, 0.05)])
    g = b.add(Op.GELU, [x], approximate="none")
    y = b.add(Op.ADD, [b.add(Op.ROUND, [b.add(Op.DIV, [g, scalar(b, 0.04)])]), scalar(b, -5.0)])
    y = b.add(Op.MINIMUM, [b.add(Op.MAXIMUM, [y, scalar(b, -128.0)]), scalar(b, 127.0)])
    return b.build([b.add(Op.CAST, [y], dtype=DType.I8), b.add(Op.CAST, [g], dtype=DType.F16)])


@pytest.mark.parametrize("shape", [(3001,), (7, 1029), (64, 4096)])
def test_int8_and_fp16_streams_match(shape: tuple[int, ...]) -> None:
    graph = _quant_graph(*((1, *shape) if len(shape) == 1 else shape))
    q = torch.randint(-128, 128, (1, *shape) if len(shape) == 1 else shape, dtype=torch.int8)
    _run(graph, [q])


def test_broadcast_residual_streams_match() -> None:
    b = GraphBuilder()
    x, r, s = inputs(b, ((33, 1000), DType.F32), ((33, 1000), DType.F32), ((1000,), DType.F32))
    out = b.add(Op.MUL, [b.add(Op.ADD, [b.add(Op.GELU, [x], approximate="none"), r]), s])
    xs = [torch.randn(33, 1000), torch.randn(33, 1000), torch.randn(1000)]
    xs[0][0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    _run(b.build([out]), xs)


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
def test_row_kernel_streams_match(kind: str) -> None:
    graph, _ = norm_graph(kind, 40, 1100)
    plan = hand_plan(graph, [[n.name for n in graph.compute_nodes]])
    _run(graph, [torch.randn(40, 1100) * 3, torch.randn(1100), torch.randn(1100)], plan)


def test_only_outputs_of_several_llcs_stream() -> None:
    graph = _quant_graph(4, 1024)  # 4 KiB of int8 and 8 KiB of fp16 stored: 3 LLCs of 4 KiB
    big = build(plan_fusion(graph, _small_llc()), _small_llc())
    small = build(plan_fusion(graph, target()), target())
    assert all(k.stream for k in big.kernels) and not any(k.stream for k in small.kernels)  # type: ignore[union-attr]


def test_nan_propagates_through_clamp_helpers() -> None:
    """vf_max / vf_min (rewritten so constant bounds fold): NaN from either side survives."""
    b = GraphBuilder()
    x, y = inputs(b, ((8,), DType.F32), ((8,), DType.F32))
    outs = [b.add(op, args) for op in (Op.MAXIMUM, Op.MINIMUM) for args in ([x, y], [y, x], [x, scalar(b, 0.5)])]
    nan = float("nan")
    xs = [
        torch.tensor([nan, 1.0, nan, -0.0, 2.0, -3.0, 0.5, 7.0]),
        torch.tensor([1.0, nan, nan, 0.0, 3.0, -4.0, 0.5, 6.0]),
    ]
    ex = native_executor(plan_fusion(graph := b.build(outs), target()), target(), Context(Options.from_env()))
    for g, w in zip(ex(xs), interp.run(graph, xs), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("kind", ["softmax", "quant"])
def test_streamed_simd_loops_vectorize(kind: str, tmp_path: Path) -> None:
    if kind == "softmax":
        graph, _ = norm_graph("softmax", 40, 1100)
        plan = hand_plan(graph, [[n.name for n in graph.compute_nodes]])
        ex = _run(graph, [torch.randn(40, 1100), torch.randn(1100), torch.randn(1100)], plan)
    else:
        ex = _run(_quant_graph(7, 1029), [torch.zeros(7, 1029, dtype=torch.int8)])
    assert "vf_stream(" in ex.source
    simd, vectorized = simd_loops_vectorized(ex.source, tmp_path)
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"
