"""Row groups stream their stores on small-L2 cores once loads and stores move half an LLC
(`strategy.GROUP_STREAM_LLCS`, through `strategy.stream_prefetched_rows`): LayerNorm 8192x256 (8 MiB in,
8 MiB out) at a 32 MiB LLC does, 4096 rows, a 1 MiB L2 and a storing pass with a GELU do not. Streamed
kernels match eager with partial last groups, 2 threads, a strided view as input and at every tier here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen import native_helpers
from tests.codegen.kernel_graphs import layer_norm_graph, norm_graph
from tests.codegen.native_helpers import check, hand_plan, rendered_layernorm
from tests.fusion.fusion_patterns import FIXED_CPU
from tests.kernel_families import tiers_here

from vfuse.ir import Graph
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel, Walk
from vfuse.targets import get_target
from vfuse.targets.isa import Isa

ZEN3 = dataclasses.replace(FIXED_CPU, simd_lanes=8, l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20)


def _kernel(graph: Graph, target: object) -> Kernel:
    prog = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target)
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    return k


def test_row_groups_stream_from_half_an_llc_on_small_l2_cores() -> None:
    k = _kernel(layer_norm_graph(8192, 256), ZEN3)
    assert k.walk is Walk.ROW_GROUPS and k.prefetch is not None
    assert k.stream and [p.streamed for p in k.passes] == [False, False, True]
    # 4096 rows move a quarter of the LLC (a copy of that many bytes ran at its in-cache rate).
    assert not _kernel(layer_norm_graph(4096, 256), ZEN3).stream
    # A 1 MiB L2 (Zen 4 / 5, not measured there) or an unknown one keeps the stores cached.
    for l2 in (1 << 20, 0):
        assert not _kernel(layer_norm_graph(8192, 256), dataclasses.replace(ZEN3, l2_bytes=l2)).stream
    # A GELU in the storing pass: bound by its arithmetic, the chunk copy would cost more.
    graph, _ = norm_graph("layernorm", 8192, 256)
    gelu = _kernel(graph, ZEN3)
    assert gelu.walk is Walk.ROW_GROUPS and not gelu.stream


@pytest.fixture
def _tiny_llc(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    tier: Isa = request.param
    # An LLC of 1 MiB: a thousand 256-wide rows move more than half of it.
    cpu = dataclasses.replace(get_target("cpu", isa=tier), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=1 << 20)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


@pytest.mark.parametrize("_tiny_llc", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize("n", [1024, 1025, 1027, 4097])
def test_streamed_row_groups_match_eager(_tiny_llc: None, n: int) -> None:
    # 1025 and 1027 end with a partial group; the rows' mean is far from 0 in some of them.
    graph = layer_norm_graph(n, 256)
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 256, generator=gen) * 3 + torch.randn(n, 1, generator=gen) * 10
    xs = [x, torch.randn(256, generator=gen), torch.randn(256, generator=gen)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    # (a walk of single rows streams too here: it moves two of these LLCs)
    assert k.walk in (Walk.ROW_GROUPS, Walk.ROWS) and k.stream
    assert "vf_stream(&" in ex.source and "vf_stream_fence" in ex.source
    torch.testing.assert_close(ex(xs)[0], F.layer_norm(x, (256,), xs[1], xs[2]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_layer_norm_of_a_view_through_torch_compile(threads: int) -> None:
    # The bench's layernorm_small size (streamed on this machine where its L2 is small), its rows
    # read through a strided view; the output is a fresh tensor each call.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(threads)
    base = torch.randn(8192, 263, generator=gen)
    x = base[:, 5:261]
    norm = torch.nn.LayerNorm(256)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(256, generator=gen))
        norm.bias.copy_(torch.randn(256, generator=gen))
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            f = torch.compile(norm, backend="vfuse")
            for _ in range(2):
                torch.testing.assert_close(f(x), norm(x), rtol=1e-5, atol=1e-5)
        finally:
            torch.set_num_threads(before)


def test_symbolic_rows_stream_per_call(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A first call under the limit (the dynamic bench's hint, 3/4 of the rows + 1) must not leave
    # larger calls unstreamed: the choice is the call's (one flag), both sides run and match eager.
    from vfuse.codegen.cpp.streaming import STREAM_FLAG

    small = dataclasses.replace(get_target("cpu"), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=4 << 20)
    shapes = [1023, 1500, 4097, 1031, 2048]  # 8 bytes a row element: 2 MiB (half the LLC) is 1024 rows
    program, source = rendered_layernorm(monkeypatch, tmp_path, small, shapes)
    (k,) = [k for k in program.kernels if isinstance(k, Kernel) and k.stream_gate is not None]  # type: ignore[attr-defined]
    assert k.walk is Walk.ROW_GROUPS and f"const bool {STREAM_FLAG} =" in source and "vf_stream(&" in source
    # The half-LLC gate, beside (`otherwise`) the 2-LLC one every streamed kernel has.
    gates = [k.stream_gate]
    while gates[-1].otherwise is not None:
        gates.append(gates[-1].otherwise)
    (gate,) = [g for g in gates if g.limit == (2 << 20)]
    env = gate.moved.env
    moved = [env.evaluator(gate.moved.expr)(rows) for rows in shapes]
    assert min(moved) < gate.limit <= max(moved)
