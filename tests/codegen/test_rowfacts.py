"""Row facts (schedule/rowfacts.py): divisors fixed for a pass become reciprocal
multiplies, exp of x - rowmax(x) uses the prelude's vf_exp_nonpos; results match float64
and eager, and only the proven patterns are rewritten."""

from __future__ import annotations

import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, executor, hand_plan, inputs

from vfuse.ir import DType, GraphBuilder, Op

INF, NAN = float("inf"), float("nan")


def _row_kernel_source(graph) -> str:  # type: ignore[no-untyped-def]
    ex = executor(graph, hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    return ex.source[ex.source.index("// group 0") :]


def test_exp_nonpos_matches_float64_and_flushes_below_normal() -> None:
    # x - amax(x) with amax = 0 in each row: exp over [-110, 0] plus the specials it can meet.
    b = GraphBuilder()
    (x,) = inputs(b, ((4, 4096), DType.F32))
    e = b.add(Op.EXP, [b.add(Op.SUB, [x, b.add(Op.AMAX, [x], axes=(1,), keepdim=True)])])
    graph = b.build([e])
    xs = torch.linspace(-110.0, 0.0, 4 * 4096).reshape(4, 4096)
    xs[:, -1] = 0.0  # each row's max
    xs[1, 5], xs[2, 7] = -INF, NAN  # -inf -> 0; a NaN makes its row's max and exps NaN
    ex = check(graph, [xs], hand_plan(graph, [[n.name for n in graph.compute_nodes]]), rtol=1.2e-7, atol=1.2e-38)
    assert "vf_exp_nonpos(" in ex.source
    (got,) = ex([xs])
    want = torch.exp(xs.double())
    rows = (torch.arange(4) != 2)[:, None]  # not the NaN row
    rel = ((got.double() - want).abs() / want)[(xs >= -87.3365) & rows]
    assert rel.max() < 1.2e-7  # <= 1.01 ulp, as vf_exp
    assert (got[(xs < -87.3366) & rows] == 0).all()  # below 2^-126: flushed
    assert got[1, 5] == 0 and got[2].isnan().all()


def test_only_x_minus_its_own_row_max_takes_exp_nonpos() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((3, 512), DType.F32), ((3, 512), DType.F32))
    mx = b.add(Op.AMAX, [x], axes=(1,), keepdim=True)
    ok = b.add(Op.EXP, [b.add(Op.SUB, [x, mx])])
    other = b.add(Op.EXP, [b.add(Op.SUB, [y, mx])])  # y - max(x) may be positive
    graph = b.build([ok, other])
    xs = [torch.randn(3, 512), torch.randn(3, 512) + 3]
    ex = check(graph, xs, hand_plan(graph, [[n.name for n in graph.compute_nodes]]), rtol=1.2e-7, atol=0)
    assert ex.source.count("vf_exp_nonpos(") == 2  # the prelude's definition and one use


def test_softmax_uses_both_facts() -> None:
    graph, _ = norm_graph("softmax", 4, 1024)
    src = _row_kernel_source(graph)
    assert "vf_exp_nonpos(" in src and src.count(" / ") == 1 and "_rcp_1 = 1.0f / (float)" in src  # no other division
