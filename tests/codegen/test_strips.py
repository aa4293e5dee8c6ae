"""Long-row reductions through strips (`Accumulate.STRIPS`, codegen/cpp/strips.py) and row
prefetch (schedule/prefetch.py): sums over rows run several accumulator chains per lane, first
passes only where the rows are prefetched; results match eager, the lane loops vectorize."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.codegen import native_helpers
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, hand_plan, inputs, scalar, target
from tests.codegen.vectorization import simd_loops_vectorized

from vfuse.fusion import FusionPlan
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.schedule.kernel import Kernel
from vfuse.schedule.strategy import CHAINS, FIRST_CHAINS, UNPREFETCHED_FLOATS

VECTOR = target().simd_lanes  # a strip's lanes: one vector
UNPREFETCHED = UNPREFETCHED_FLOATS // VECTOR  # chains of a first pass over rows not prefetched (< 2: none)


@pytest.fixture(autouse=True)
def _l1_48k(monkeypatch: pytest.MonkeyPatch) -> None:
    # Row prefetch needs room in L1 (schedule/prefetch.py): these tests render prefetched rows
    # whatever this machine's L1, so they compile for its target with 48 KiB of L1.
    cpu = target()
    monkeypatch.setattr(native_helpers, "target", lambda: dataclasses.replace(cpu, l1_bytes=48 << 10))


def _plan(graph: Graph) -> FusionPlan:
    """One fused row kernel, as the planner makes it."""
    return hand_plan(graph, [[n.name for n in graph.compute_nodes]])


def _kernel_source(source: str) -> str:
    return source[source.index("// group 0") :]


@pytest.mark.parametrize("d", [1000, 1024, 4096])
def test_layernorm_long_rows_with_offset_mean_match_eager(d: int) -> None:
    # 1000: strips and a remainder of 40 / 104; 1024: one block; 4096: four blocks of 1024.
    # A mean of 10 standard deviations (more and the mean pass alone already misses 1e-5
    # against the reference, with one chain or several).
    graph, eager = norm_graph("layernorm", 9, d)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(9, d, generator=gen) * 3 + 30, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    ex = check(graph, xs, _plan(graph))
    src = _kernel_source(ex.source)
    # The mean pass over prefetched rows takes FIRST_CHAINS chains, the variance pass CHAINS; rows of
    # 4096 fill half of L1 on their own and are not prefetched (the mean pass takes one 512-bit
    # vector of chains: one, a plain SIMD reduction, at AVX-512).
    assert ("__builtin_prefetch" in src) == (d <= 1024)
    first = FIRST_CHAINS if d <= 1024 else max(UNPREFETCHED, 1)
    assert f"_q{first - 1};" in src and f"_q{CHAINS - 1};" in src and f"_q{CHAINS};" not in src
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)


def test_first_pass_without_prefetch_keeps_one_512_bit_vector_of_chains() -> None:
    # Rows of 1.5 KiB are not prefetched: the mean pass takes as many chains as make one 512-bit
    # vector (more there only piled up demand misses): a plain SIMD reduction at AVX-512, two
    # chains at AVX2; the variance pass takes strips.
    graph, eager = norm_graph("layernorm", 7, 384)
    xs = [torch.randn(7, 384) * 2 + 1, torch.randn(384), torch.randn(384)]
    ex = check(graph, xs, _plan(graph))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.prefetch is None
    src = _kernel_source(ex.source)
    mean_pass = src[: src.index("const float", src.index("t2_acc"))]
    if UNPREFETCHED < 2:
        assert "_sp[" not in mean_pass and "reduction(+:" in mean_pass
    else:
        assert f"t2_q{UNPREFETCHED - 1};" in mean_pass and f"t2_q{UNPREFETCHED};" not in mean_pass
    assert "_sp[" in src
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d", [1000, 1024])
def test_softmax_max_pass_plain_and_exp_pass_one_chain(d: int) -> None:
    # The max pass tracks NaN in a flag (g++ would split it off a lane loop): a plain SIMD
    # reduction. The exp-sum pass is bound by exp's instructions: one chain, which still
    # drops g++'s serial horizontal sum.
    graph, eager = norm_graph("softmax", 6, d)
    xs = [torch.randn(6, d) * 3, torch.randn(d), torch.randn(d)]
    xs[0][2, 17] = float("nan")  # in a chain
    xs[0][3, d - 1] = float("nan")  # in the remainder (d = 1000) or the last step
    xs[0][4, 500] = float("-inf")
    xs[0][5, 3] = 1e30  # the max sits in the first lane's first chain
    ex = check(graph, xs, _plan(graph))
    src = _kernel_source(ex.source)
    assert "reduction(max:" in src and "_q1 = " not in src and "_q0 = (float)0" in src
    got = ex(xs)[0]
    torch.testing.assert_close(got, eager(*xs), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert got[2].isnan().all() and got[3].isnan().all() and not got[4].isnan().any()


def _centered_sums(d: int, dtype: DType) -> tuple:
    """Sum and sum of squares of x - mean(x) per row: a second, cheap pass."""
    b = GraphBuilder()
    (x,) = inputs(b, ((6, d), dtype))
    xf = b.add(Op.CAST, [x], dtype=DType.F32) if dtype is not DType.F32 else x
    mean = b.add(Op.MUL, [b.add(Op.SUM, [xf], axes=(1,), keepdim=True), scalar(b, 1.0 / d)])
    c = b.add(Op.SUB, [xf, mean])
    outs = [
        b.add(Op.SUM, [c], axes=(1,), keepdim=False),
        b.add(Op.SUM, [b.add(Op.MUL, [c, c])], axes=(1,), keepdim=False),
    ]
    return b.build(outs), x


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.F16])
def test_sums_through_strips_with_remainder(dtype: DType) -> None:
    d = 2 * CHAINS * VECTOR * 3 + 21  # a remainder of 21 past the strips
    graph, _ = _centered_sums(d, dtype)
    xs = torch.randn(6, d) * 2
    xs[1, d - 3] = 50.0  # in the remainder ...
    xs[2, 5] = -50.0  # ... in the first chain of the first lane
    xs[3, d - 30] = 60.0  # the last step
    xs[4, d // 2] = float("nan")  # NaN propagates out of a chain
    xs[5, d - 1] = float("inf")  # and inf out of the remainder
    xs = xs.to(dtype.torch)
    ex = check(graph, [xs], _plan(graph), rtol=1e-5, atol=1e-4)
    assert f"_q{CHAINS - 1};" in _kernel_source(ex.source)
    xf = xs.float()
    c = xf - xf.mean(1, keepdim=True)
    total, ssq = ex([xs])
    torch.testing.assert_close(total, c.sum(1), rtol=1e-5, atol=1e-3, equal_nan=True)
    torch.testing.assert_close(ssq, (c * c).sum(1), rtol=1e-5, atol=1e-3, equal_nan=True)
    assert torch.isnan(ssq[4]) and torch.isnan(ssq[5]) and ssq[1] > 2000 and ssq[3] > 3000


def test_prefetch_plan_follows_rows_not_broadcast_weights() -> None:
    graph, _ = norm_graph("rms", 16, 1024)
    xs = [torch.randn(16, 1024), torch.randn(1024), torch.randn(1024)]
    ex = check(graph, xs, _plan(graph))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    pf = k.prefetch
    assert pf is not None and pf.distance == 3 and pf.row_bytes == 4096
    assert [pl.load.buf for pl in pf.loads] == [graph.inputs[0].name]  # x, not the weight
    assert pf.loads[0].shares == ((0, 512), (512, 1024))
    # The last rows prefetch the last row again instead of reading past the buffer.
    assert "const int64_t i0_pf = i0 + 3 < 16 ? i0 + 3 : 15;" in ex.source
    # One share of the row's lines before each of the two passes, every line once.
    assert "for (int64_t c = 0; c < 512; c += 16) __builtin_prefetch(" in ex.source
    assert "for (int64_t c = 512; c < 1024; c += 16) __builtin_prefetch(" in ex.source


@pytest.mark.parametrize(("kind", "d"), [("layernorm", 1024), ("layernorm", 4096), ("rms", 1000), ("softmax", 1000)])
def test_strips_lane_loops_vectorize(kind: str, d: int, tmp_path: Path) -> None:
    graph, _ = norm_graph(kind, 8, d)
    ex = check(graph, [torch.randn(8, d), torch.randn(d), torch.randn(d)], _plan(graph))
    assert f"for (int64_t sl = 0; sl < {VECTOR};" in ex.source
    simd, vectorized = simd_loops_vectorized(ex.source, tmp_path)
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"


def test_division_by_a_row_scalar_becomes_a_reciprocal_multiply() -> None:
    # x / sum(x) (softmax's last pass) multiplies by 1/sum hoisted out of the row loop; a
    # per-element divisor stays a division. Both match eager within a few ulp (the sum too).
    b = GraphBuilder()
    x, y = inputs(b, ((6, 1000), DType.F32), ((6, 1000), DType.F32))
    s = b.add(Op.SUM, [x], axes=(1,), keepdim=True)
    graph = b.build([b.add(Op.DIV, [b.add(Op.DIV, [x, s]), y])])
    xs = [torch.rand(6, 1000) + 0.5, torch.rand(6, 1000) + 0.5]
    ex = check(graph, xs, _plan(graph), rtol=1e-6, atol=0)
    src = _kernel_source(ex.source)
    assert src.count("_rcp_1 = 1.0f / (float)") == 1 and src.count(" / ") == 2  # 1/sum and x*r/y
    torch.testing.assert_close(ex(xs)[0], xs[0] / xs[0].sum(1, keepdim=True) / xs[1], rtol=1e-6, atol=0)
