"""Reduction blocks with several accumulators (`Accumulate.LANES`, codegen/cpp/lanes.py): rows of
2 to 4 x LANES elements, a partial last group of lanes, sums, products and integer sums match
the reference. LANES is what the schedule takes for this machine's vector width."""

from __future__ import annotations

import pytest
import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, hand_plan, inputs, target

from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule.strategy import lanes

LANES = lanes(target().simd_lanes)


@pytest.mark.parametrize("d", [2 * LANES, 3 * LANES + 8, 4 * LANES])
def test_layernorm_rows_with_lanes_match(d: int) -> None:
    graph, _ = norm_graph("layernorm", 33, d)
    plan = hand_plan(graph, [[n.name for n in graph.compute_nodes]])
    ex = check(graph, [torch.randn(33, d) * 4 + 1, torch.randn(d), torch.randn(d)], plan)
    assert "_ln[c]" in ex.source


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32])
def test_sum_and_prod_with_lanes_match(dtype: DType) -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((5, 3 * LANES + 7), dtype))
    s = b.add(Op.SUM, [x], axes=(1,), keepdim=False)
    p = b.add(Op.PROD, [x], axes=(1,), keepdim=False)
    xs = torch.randn(5, 3 * LANES + 7) if dtype is DType.F32 else torch.randint(-3, 4, (5, 3 * LANES + 7))
    if dtype is DType.F32:
        xs = 1 + xs / 50  # a product of ~200 factors stays finite
    ex = check(b.build([s, p]), [xs.to(dtype.torch)], rtol=1e-4)
    assert "_ln[c]" in ex.source


@pytest.mark.parametrize("op", [Op.AMAX, Op.AMIN, Op.SUM])
def test_integer_max_min_and_sum_fold_through_lanes(op: Op) -> None:
    # Integer max/min track no NaN, so they take the lanes and their pairwise fold too.
    b = GraphBuilder()
    (x,) = inputs(b, ((7, 3 * LANES + 5), DType.I32))
    out = b.add(op, [x], axes=(1,), keepdim=False)
    xs = torch.randint(-1000, 1000, (7, 3 * LANES + 5), dtype=torch.int32)
    xs[3, 3 * LANES + 4] = 5000  # the extreme sits in the last, partial group of lanes
    xs[4, 0] = -5000
    ex = check(b.build([out]), [xs])
    assert f"_ln[c + {LANES // 2}]" in ex.source  # folded pairwise
