"""A normalization's affine step (schedule/rowfacts.affine_fmas): ((x - m) * s) * w + b with m, s
row scalars renders its * w + b as one fma. Results stay as close to eager and float64 as before,
odd widths and rows far from 0 included; a row of one element keeps eager's exact 0 (b); only the
proven pattern is rewritten."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, executor, hand_plan, inputs

import vfuse
from vfuse.ir import DType, GraphBuilder, Op


def _fused(graph) -> str:  # type: ignore[no-untyped-def]
    ex = executor(graph, hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    return ex.source[ex.source.index("// group 0") :]


@pytest.mark.parametrize("width", [2, 7, 13, 256, 1023, 1024, 1025])
@pytest.mark.parametrize("shift", [0.0, 10.0])
def test_layer_norm_gelu_matches_eager_and_float64(width: int, shift: float) -> None:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(37, width, generator=g) * 2 + shift
    w, b = torch.randn(width, generator=g) * 0.5 + 1, torch.randn(width, generator=g) * 0.1
    fn = lambda x, w, b: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))  # noqa: E731
    got = vfuse.compile(fn, (x, w, b))(x, w, b)
    torch.testing.assert_close(got, fn(x, w, b))
    if shift:
        return  # the fp32 mean's rounding (times rstd) dominates both, eager's Welford moments err less
    ref = fn(x.double(), w.double(), b.double())
    # Within a few times eager's own error against float64.
    eager_err = (fn(x, w, b).double() - ref).abs()
    err = (got.double() - ref).abs()
    assert err.max() <= 4 * eager_err.max() + 1e-6, (err.max(), eager_err.max())
    assert err.mean() <= 2 * eager_err.mean() + 1e-8, (err.mean(), eager_err.mean())


def test_norm_graph_renders_one_fma_per_element() -> None:
    graph, _ = norm_graph("ln", 4, 1024)
    out_loop = _fused(graph)
    out_loop = out_loop[out_loop.rindex("#pragma omp simd") :]
    assert out_loop.count("vf_fmaf(") == 1 and " - t" in out_loop  # x - mean stays a subtraction


def test_norm_graph_numerics() -> None:
    graph, _ = norm_graph("ln", 41, 1025)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(41, 1025, generator=g) + 3, torch.randn(1025, generator=g), torch.randn(1025, generator=g)]
    check(graph, xs, hand_plan(graph, [[n.name for n in graph.compute_nodes]]), rtol=1e-5, atol=1e-5)


def test_a_row_of_one_element_is_exactly_its_bias() -> None:
    x, w, b = torch.randn(9, 1) * 5 + 3, torch.randn(1), torch.randn(1)
    fn = lambda x, w, b: F.layer_norm(x, (1,), w, b)  # noqa: E731
    compiled = vfuse.compile(fn, (x, w, b))
    assert torch.equal(compiled(x, w, b), fn(x, w, b))


def test_only_row_scalars_and_single_uses_are_fused() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((3, 64), DType.F32), ((3, 64), DType.F32))
    mean = b.add(Op.SUM, [x], axes=(1,), keepdim=True)
    xc = b.add(Op.SUB, [x, mean])
    scaled_by_elem = b.add(Op.MUL, [b.add(Op.SUB, [x, mean]), y])  # y is no row scalar
    reused = b.add(Op.ADD, [b.add(Op.MUL, [xc, mean]), xc])  # xc has two uses
    graph = b.build([scaled_by_elem, reused])
    src = _fused(graph)
    assert "vf_fmaf(" not in src
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)]
    check(graph, xs, hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
