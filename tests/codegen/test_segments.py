"""Long-row reductions through segments (codegen/cpp/segments.py): a later, cheap pass over a
row reduces SEGMENTS contiguous segments side by side, the rest of the row in a remainder
loop; sums, NaN-tracking max/min and the fp16/bf16-in-fp32 path match eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import check, hand_plan, inputs, scalar
from tests.codegen.test_views_and_reductions import norm_graph

from vfuse.codegen.cpp.segments import SEGMENTS, VECTOR
from vfuse.fusion import FusionPlan
from vfuse.ir import DType, Graph, GraphBuilder, Op


def _plan(graph: Graph) -> FusionPlan:
    """One fused row kernel, as the planner makes it."""
    return hand_plan(graph, [[n.name for n in graph.compute_nodes]])


@pytest.mark.parametrize("d", [1000, 4096])
def test_layernorm_long_rows_with_offset_mean_match_eager(d: int) -> None:
    # 1000: segments of 240 and a remainder of 40; 4096: four blocks of 1024 segmented each.
    # A mean of 10 standard deviations (more and the unsegmented mean pass alone already
    # misses 1e-5 against the reference, before and after segments).
    graph, eager = norm_graph("layernorm", 9, d)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(9, d, generator=gen) * 3 + 30, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    ex = check(graph, xs, _plan(graph))
    assert f"_q{SEGMENTS - 1}" in ex.source  # the variance pass took the segments
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)


def test_first_and_expensive_passes_keep_one_chain() -> None:
    # Softmax: the max pass is the row's first (it waits on memory), the exp-sum pass is
    # bound by exp's instructions; neither is segmented.
    graph, eager = norm_graph("softmax", 5, 1024)
    xs = [torch.randn(5, 1024) * 3, torch.randn(1024), torch.randn(1024)]
    ex = check(graph, xs, _plan(graph))
    assert "_q0" not in ex.source
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)


def _centered_extremes(d: int, dtype: DType) -> tuple:
    """amax, amin and sum of squares of x - mean(x) per row: a second, cheap pass."""
    b = GraphBuilder()
    (x,) = inputs(b, ((6, d), dtype))
    xf = b.add(Op.CAST, [x], dtype=DType.F32) if dtype is not DType.F32 else x
    mean = b.add(Op.MUL, [b.add(Op.SUM, [xf], axes=(1,), keepdim=True), scalar(b, 1.0 / d)])
    c = b.add(Op.SUB, [xf, mean])
    outs = [b.add(op, [c], axes=(1,), keepdim=False) for op in (Op.AMAX, Op.AMIN)]
    outs.append(b.add(Op.SUM, [b.add(Op.MUL, [c, c])], axes=(1,), keepdim=False))
    return b.build(outs), x


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.F16])
def test_max_min_and_sum_of_squares_through_segments(dtype: DType) -> None:
    d = 2 * SEGMENTS * VECTOR * 4 + 21  # a remainder of 21 past the segments
    graph, _ = _centered_extremes(d, dtype)
    xs = torch.randn(6, d) * 2
    xs[1, d - 3] = 50.0  # the extremes sit in the remainder ...
    xs[2, 5] = -50.0  # ... and in the first segment
    xs[3, d - 30] = 60.0  # the last segment
    xs[4, d // 2] = float("nan")  # NaN propagates out of a segment
    xs[5, d - 1] = float("nan")  # and out of the remainder
    xs = xs.to(dtype.torch)
    ex = check(graph, [xs], _plan(graph), rtol=1e-5, atol=1e-4)
    assert f"_q{SEGMENTS - 1}_nan" in ex.source
    xf = xs.float()
    c = xf - xf.mean(1, keepdim=True)
    amax, amin, ssq = ex([xs])
    torch.testing.assert_close(amax, c.amax(1), rtol=1e-5, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(amin, c.amin(1), rtol=1e-5, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(ssq, (c * c).sum(1), rtol=1e-5, atol=1e-3, equal_nan=True)
    assert torch.isnan(amax[4]) and torch.isnan(amin[5]) and not torch.isnan(amax[3])
    assert amax[1] > 45 and amin[2] < -45 and amax[3] > 55  # each placed extreme was found


def test_rmsnorm_long_rows_match_eager() -> None:
    # One reduction pass (the row's first): no segments, same numerics as before.
    graph, eager = norm_graph("rms", 7, 1000)
    xs = [torch.randn(7, 1000) + 5, torch.randn(1000), torch.randn(1000)]
    ex = check(graph, xs, _plan(graph))
    assert "_q0" not in ex.source
    torch.testing.assert_close(ex(xs)[0], F.rms_norm(xs[0], (1000,), xs[1], eps=1e-6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)
