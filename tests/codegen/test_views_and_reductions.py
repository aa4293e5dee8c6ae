"""Index maps (broadcast, permute, slice, reshape, expand, cat, embedding) and row kernels."""

from __future__ import annotations

import pytest
import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, executor, hand_plan, inputs, scalar

from vfuse.ir import DType, GraphBuilder, Op

F32 = DType.F32


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_views_read_through_index_maps() -> None:
    b = GraphBuilder()
    x, y, w, idx = inputs(b, ((6, 8, 10), F32), ((10, 8), F32), ((5, 10), F32), ((6, 8), DType.I64))
    xt = b.add(Op.PERMUTE, [x], perm=(0, 2, 1))  # (6, 10, 8)
    a = b.add(Op.ADD, [xt, y])  # y broadcasts over dim 0
    s = b.add(Op.SLICE, [a], dim=2, start=1, end=8, step=2)  # (6, 10, 4)
    r = b.add(Op.RESHAPE, [s], shape=(60, 4))
    e = b.add(Op.EXPAND, [b.add(Op.RESHAPE, [y], shape=(1, 80))], shape=(60, 80))
    c = b.add(Op.CAT, [r, e, r], dim=1)  # (60, 88)
    emb = b.add(Op.EMBEDDING, [w, idx])  # (6, 8, 10)
    m = b.add(Op.MUL, [emb, x])
    sig = b.add(Op.SIGMOID, [c])
    graph = b.build([sig, m, b.add(Op.RESHAPE, [xt], shape=(6, 80))])
    xs = [rand(6, 8, 10), rand(10, 8, seed=1), rand(5, 10, seed=2), torch.randint(0, 5, (6, 8))]
    # One group per output keeps the view chains inside kernels (nothing is materialized).
    plan = hand_plan(graph, [[xt, a, s, r, e, c, sig], [emb, m], [graph.outputs[2]]])
    check(graph, xs, plan=plan, rtol=1e-6, atol=1e-7)  # sigmoid's exp may differ by an ulp


def test_contiguous_pointwise_is_one_loop() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((4, 16, 32), F32), ((4, 16, 32), F32))
    out = b.add(Op.MUL, [b.add(Op.RELU, [b.add(Op.ADD, [x, y])]), scalar(b, 0.5)])
    ex = check(b.build([out]), [rand(4, 16, 32), rand(4, 16, 32, seed=1)])
    (k,) = ex.program.kernels
    assert [lp.size for lp in k.inner] == [4 * 16 * 32] and k.inner[0].parallel and k.inner[0].vector


REDUCTIONS = [Op.SUM, Op.PROD, Op.AMAX, Op.AMIN]


@pytest.mark.parametrize("axes", [(2,), (0,), (0, 2), (1, 2), (0, 1, 2)])
def test_reductions_over_axes(axes: tuple[int, ...]) -> None:
    b = GraphBuilder()
    x, m = inputs(b, ((5, 6, 33), F32), ((5, 6, 33), DType.BOOL))
    outs = []
    for op in REDUCTIONS:
        outs.append(b.add(op, [x], axes=axes, keepdim=True))
        outs.append(b.add(op, [x], axes=axes, keepdim=False))
    outs += [b.add(Op.ANY, [m], axes=axes, keepdim=False), b.add(Op.ALL, [m], axes=axes, keepdim=True)]
    graph = b.build(outs)
    # Each reduction its own row kernel: all in one translation unit.
    plan = hand_plan(graph, [[o] for o in outs])
    xv = rand(5, 6, 33) * 0.5 + 1.0  # keeps PROD of up to 990 factors finite
    mask = torch.rand(5, 6, 33, generator=torch.Generator().manual_seed(3)) > 0.05
    ex = check(graph, [xv, mask], plan=plan, rtol=1e-4, atol=1e-5)
    # Reductions that keep the contiguous last dim reduce tiles of columns (no strided rows).
    assert all(bool(k.tile) == (2 not in axes) for k in ex.program.kernels)


def test_argmax_argmin_first_index_and_nan() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((7, 50), F32))
    outs = [
        b.add(Op.ARGMAX, [x], axes=(1,), keepdim=False),
        b.add(Op.ARGMIN, [x], axes=(0,), keepdim=True),
        b.add(Op.ARGMAX, [x], axes=(0, 1), keepdim=False),
        b.add(Op.ARGMIN, [x], axes=(0, 1), keepdim=True),
        b.add(Op.AMAX, [x], axes=(1,), keepdim=False),
    ]
    graph = b.build(outs)
    xv = torch.randint(0, 5, (7, 50)).float()  # ties: the first index must win
    xv[3, 7] = float("nan")
    check(graph, [xv], plan=hand_plan(graph, [[o] for o in outs]), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["layernorm", "rms", "softmax"])
def test_row_kernels_match_eager(kind: str) -> None:
    graph, eager = norm_graph(kind)
    xs = [rand(96, 200) * 3 + 1, rand(200, seed=1), rand(200, seed=2)]
    plan = hand_plan(graph, [[n.name for n in graph.compute_nodes]])
    ex = check(graph, xs, plan=plan)
    (k,) = ex.program.kernels
    assert k.outer[0].parallel and k.inner[-1].vector
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)
    passes = {"layernorm": 3, "rms": 2, "softmax": 3}[kind]
    assert len(k.passes) == passes
    if kind == "softmax":  # exp is computed once and kept in the row buffer
        assert any(p.buffered for p in k.passes)


def test_long_full_reduction_is_accurate_and_parallel() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((1 << 20,), F32))
    graph = b.build([b.add(Op.SUM, [x], axes=(0,), keepdim=False)])
    xv = torch.rand(1 << 20, generator=torch.Generator().manual_seed(5))
    ex = executor(graph)
    torch.testing.assert_close(ex([xv])[0], xv.double().sum().float(), rtol=2e-6, atol=0)


def test_single_row_softmax_shares_its_row_buffer() -> None:
    graph, eager = norm_graph("softmax", n=1, d=3000)
    xs = [rand(1, 3000), rand(3000, seed=1), rand(3000, seed=2)]
    ex = check(graph, xs, plan=hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    (k,) = ex.program.kernels
    assert not k.outer and any(p.buffered for p in k.passes)
    torch.testing.assert_close(ex(xs)[0], eager(*xs))


def test_column_kernel_epilogue_reads_per_column_values() -> None:
    # mean over the batch: the divisor constant and a per-column bias are used after the reduction.
    b = GraphBuilder()
    x, bias = inputs(b, ((37, 70), F32), ((70,), F32))
    s = b.add(Op.SUM, [b.add(Op.ADD, [x, bias])], axes=(0,), keepdim=False)
    out = b.add(Op.ADD, [b.add(Op.MUL, [s, scalar(b, 1 / 37)]), bias])
    graph = b.build([out])
    ex = check(graph, [rand(37, 70), rand(70, seed=1)], plan=hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    assert ex.program.kernels[0].tile
