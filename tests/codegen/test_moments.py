"""Single-pass row moments (`Kernel.moments`, schedule/moments.py, codegen/cpp/moments.py): a row
walk of LayerNorm's two sums over rows past the last-level cache takes them in one pass of per-lane
moments. Decided only there, only for that pattern and a storing pass of cheap arithmetic; the
results match eager and the reference executor at every tier here, on rows far from 0, constant
rows (variance 0) and rows with inf / NaN."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from tests.codegen import native_helpers
from tests.codegen.kernel_graphs import layer_norm_graph, norm_graph
from tests.codegen.native_helpers import check, hand_plan
from tests.fusion.fusion_patterns import FIXED_CPU
from tests.kernel_families import tiers_here

from vfuse.ir import Graph
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel, Walk
from vfuse.schedule.printer import format_kernel
from vfuse.targets import get_target
from vfuse.targets.isa import Isa

LLC32 = dataclasses.replace(FIXED_CPU, l3_bytes=32 << 20)


def _kernel(graph: Graph, target: object) -> Kernel:
    prog = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target)
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    return k


def test_moments_only_for_layer_norm_rows_past_the_llc() -> None:
    k = _kernel(layer_norm_graph(8192, 768), LLC32)  # 24 MiB in, 24 MiB out
    assert k.walk is Walk.ROWS and k.moments == (16, 4)
    assert "passes 0-1 as one of per-lane moments (16-lane vectors, 4 a chunk)" in format_kernel(k)
    assert _kernel(layer_norm_graph(8192, 768), dataclasses.replace(LLC32, simd_lanes=8)).moments == (8, 4)
    assert _kernel(layer_norm_graph(8192, 768, corrected=True), LLC32).moments == (16, 4)  # the frontend's
    assert _kernel(layer_norm_graph(2048, 768), LLC32).moments is None  # 12 MiB: in the LLC
    assert _kernel(layer_norm_graph(8192, 776), LLC32).moments is None  # not whole chunks of 4 vectors
    assert _kernel(layer_norm_graph(8192, 768), dataclasses.replace(LLC32, l3_bytes=0)).moments is None
    rms, _ = norm_graph("rms", 8192, 768)  # one sum: nothing to merge
    assert _kernel(rms, LLC32).moments is None
    ln_gelu, _ = norm_graph("layernorm", 8192, 768)  # a GELU in the storing pass: bound by its arithmetic
    assert _kernel(ln_gelu, LLC32).moments is None


@pytest.fixture
def _tiny_llc(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    tier: Isa = request.param
    cpu = dataclasses.replace(get_target("cpu", isa=tier), l3_bytes=64 << 10)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


@pytest.mark.parametrize("_tiny_llc", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize(("n", "d"), [(64, 768), (9, 1024), (33, 320)])
@pytest.mark.parametrize("corrected", [False, True], ids=["mean", "corrected"])
def test_layer_norm_moments_match_eager(_tiny_llc: None, n: int, d: int, corrected: bool) -> None:
    gen = torch.Generator().manual_seed(n * d)
    x = torch.randn(n, d, generator=gen) * 3 + torch.randn(n, 1, generator=gen) * 100
    x[1] = 7.0  # a constant row: variance 0
    x[2, 5] = float("inf")
    x[3, 0] = float("nan")
    graph = layer_norm_graph(n, d, corrected)
    xs = [x, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]), rtol=1e-4, atol=1e-4)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.walk is Walk.ROWS and k.moments == (ex.program.vector_width, 4) and "mo_m" in ex.source
    got, want = ex(xs)[0], F.layer_norm(x, (d,), xs[1], xs[2])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    if corrected:  # the constant row's mean is the value exactly, as eager's Welford mean
        assert torch.equal(got[1], want[1])
