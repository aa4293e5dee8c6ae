"""Streamed row passes store from registers where their outputs are aligned (`Pass.stream_lanes`,
`strategy.stream_lanes`, rendered by codegen/cpp/streaming.py): one non-temporal store per vector,
no L1 chunk in between; misaligned outputs, rows not a multiple of the lanes and other dtypes keep
the chunk copy. A streamed row group's storing pass walks the group's rows inside each step
(`Pass.group_columns`, codegen/cpp/groupcolumns.py): the weights loaded once a group. Softmax,
LayerNorm and RMSNorm against eager at every tier here, partial row groups, one row, outputs
shifted off their alignment, strided inputs through torch.compile at 1 and 2 threads."""

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

from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.fusion import FusionPlan
from vfuse.ir import Graph
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel, Program, Segment
from vfuse.schedule.printer import format_kernel
from vfuse.targets import get_target
from vfuse.targets.isa import Isa

ZEN3 = dataclasses.replace(FIXED_CPU, simd_lanes=8, l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20)


def _kernel(graph: Graph, target: object) -> Kernel:
    prog = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target)
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    return k


def _lanes(k: Kernel) -> list[int]:
    return [p.stream_lanes for p in k.passes if p.streamed]


@pytest.mark.parametrize(("lanes", "d", "want"), [(8, 1024, 8), (16, 1024, 8), (4, 1028, 4), (8, 1028, 0)])
def test_softmax_streams_from_registers(lanes: int, d: int, want: int) -> None:
    # At most 8 lanes a store (one ymm on every x86 tier); rows of 1028 are not whole 8-lane steps.
    k = _kernel(norm_graph("softmax", 8192, d)[0], dataclasses.replace(ZEN3, simd_lanes=lanes))
    assert k.stream and _lanes(k) == [want]
    assert ("from registers" in format_kernel(k)) == bool(want)


def test_layer_norm_groups_stream_from_registers_and_cached_kernels_do_not() -> None:
    k = _kernel(layer_norm_graph(8192, 256), ZEN3)
    assert _lanes(k) == [8] and [p.group_columns for p in k.passes] == [0, 0, 8]
    assert "group's rows per 8-lane step" in format_kernel(k)
    cached = _kernel(layer_norm_graph(1024, 256), ZEN3)
    assert not cached.stream and all(p.stream_lanes == 0 and p.group_columns == 0 for p in cached.passes)
    # Softmax's rows are not walked in groups; its storing pass divides by a row scalar anyway.
    assert all(p.group_columns == 0 for p in _kernel(norm_graph("softmax", 8192, 1024)[0], ZEN3).passes)


@pytest.fixture
def _tiny_llc(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    tier: Isa = request.param
    # An LLC of 1 MiB: these kernels' loads and stores move more than it holds, so they stream.
    cpu = dataclasses.replace(get_target("cpu", isa=tier), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=1 << 20)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


def _rows(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen) * 3 + torch.randn(n, 1, generator=gen) * 10


@pytest.mark.parametrize("_tiny_llc", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize(("n", "d"), [(1, 8192), (7, 8192), (331, 1024), (263, 1028), (1031, 256)])
def test_streamed_softmax_matches_eager(_tiny_llc: None, n: int, d: int) -> None:
    graph, ref = norm_graph("softmax", n, d)
    x = _rows(n, d, n)
    xs = [x, torch.randn(d), torch.randn(d)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    assert "vf_stream_fence" in ex.source
    torch.testing.assert_close(ex(xs)[0], ref(*xs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("_tiny_llc", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize("n", [1025, 1027, 4099])
def test_streamed_layer_norm_groups_match_eager(_tiny_llc: None, n: int) -> None:
    # Partial last groups (1025, 1027, 4099 rows), rows whose mean is far from 0.
    graph = layer_norm_graph(n, 256)
    x = _rows(n, 256, n)
    xs = [x, torch.randn(256), torch.randn(256)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.stream and _lanes(k) and "_stream_ps(" in ex.source
    torch.testing.assert_close(ex(xs)[0], F.layer_norm(x, (256,), xs[1], xs[2]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("_tiny_llc", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize("n", [1025, 1031])
def test_streamed_rms_norm_groups_match_eager(_tiny_llc: None, n: int) -> None:
    graph, ref = norm_graph("rms", n, 256)
    xs = [_rows(n, 256, n), torch.randn(256), torch.randn(256)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.stream and k.passes[-1].group_columns
    torch.testing.assert_close(ex(xs)[0], ref(*xs), rtol=1e-5, atol=1e-5)


def _edit(program: Program, lanes: int) -> Program:
    """`program` with its row kernel's last pass walked in group columns of `lanes`, by hand."""

    def last(k: Kernel) -> Kernel:
        *rest, p = k.passes
        # In row groups (a row held in registers, `Kernel.register_row`, has no group columns).
        return dataclasses.replace(k, register_row=0, passes=(*rest, dataclasses.replace(p, group_columns=lanes)))

    steps = tuple(
        dataclasses.replace(s, kernels=tuple(last(k) if isinstance(k, Kernel) else k for k in s.kernels))
        if isinstance(s, Segment)
        else s
        for s in program.steps
    )
    return dataclasses.replace(program, steps=steps)


def _load(plan: FusionPlan, program: Program) -> object:
    ctx = Context(Options.from_env())
    source = compiler.render(program, ctx)
    return compiler.load(plan, program, source, compiler.build(source, program, ctx), ctx)


@pytest.mark.parametrize(("kind", "n"), [("layernorm", 1027), ("rms", 64), ("layernorm", 8)])
def test_cached_group_columns_render_as_decided(kind: str, n: int) -> None:
    # Not chosen for cached stores (not faster), but rendered as decided where a Program says so:
    # the group's rows inside each 8-lane step, stores straight into the output (GELU included).
    graph, ref = norm_graph(kind, n, 256)
    plan = hand_plan(graph, [[nd.name for nd in graph.compute_nodes]])
    prog = build(plan, native_helpers.target())
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    assert not k.stream and k.row_group == 4 and k.passes[-1].group_columns == 0
    ex = _load(plan, _edit(prog, 4))
    assert "i0_n == 4) {" in ex.source and "vb += 4" in ex.source
    gen = torch.Generator().manual_seed(n)
    xs = [torch.randn(n, 256, generator=gen) * 3 + 1, torch.randn(256, generator=gen), torch.randn(256, generator=gen)]
    want = ref(*xs)
    got = ex(xs)
    torch.testing.assert_close(got[0], want[0] if isinstance(want, tuple) else want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("_tiny_llc", [Isa.AVX2], ids=["avx2"], indirect=True)
@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
@pytest.mark.parametrize("shift", [0, 1, 4])
def test_misaligned_output_takes_the_chunk_copy(_tiny_llc: None, kind: str, shift: int) -> None:
    # The kernel called again with its output `shift` floats past an aligned start: 1 and 4 floats
    # are off the 32-byte alignment, so every row takes the chunk path (vf_stream), 0 the registers.
    if Isa.AVX2 not in tiers_here():
        pytest.skip("needs the avx2 tier")
    n, d = (1031, 1024) if kind == "softmax" else (1031, 256)
    graph, ref = norm_graph(kind, n, d) if kind == "softmax" else (layer_norm_graph(n, d), None)
    xs = [_rows(n, d, shift), torch.randn(d), torch.randn(d)]
    if ref is None:
        ref = lambda x, w, b: F.layer_norm(x, (d,), w, b)  # noqa: E731
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    assert "_mm256_stream_ps(" in ex.source and "vf_stream(&" in ex.source
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert kind == "softmax" or k.passes[-1].group_columns == 8
    first = ex(xs)[0]
    slot = [i for i, p in enumerate(ex._ptrs) if p == first.data_ptr()]
    assert len(slot) == 1, "the output's pointer slot"
    store = torch.full((n * d + 64,), float("nan"))
    base = (-store.data_ptr() // 4) % 16  # floats to the next 64-byte boundary
    out = store[base + shift : base + shift + n * d].view(n, d)
    ex._ptrs[slot[0]] = out.data_ptr()
    (seg,) = ex.program.segments
    assert ex._entries[seg.name](ex._ptrs, ex._arena.data_ptr() + ex._arena_off, ex._seeds.data_ptr(), 2) == 0
    torch.testing.assert_close(out, ref(*xs), rtol=1e-5, atol=1e-5)
    assert store[: base + shift].isnan().all() and store[base + shift + n * d :].isnan().all()


@pytest.mark.parametrize("threads", [1, 2])
def test_strided_softmax_through_torch_compile(threads: int) -> None:
    # The bench's softmax size, its rows read through a strided view (a column slice of a wider
    # tensor); and an empty batch. Streamed on this machine where its L2 is small.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        f = torch.compile(lambda x: torch.softmax(x, -1), backend="vfuse", dynamic=False)
        x = (torch.randn(8192, 1031, generator=gen) * 3)[:, 3:1027]
        torch.testing.assert_close(f(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
        e = torch.randn(0, 1024)
        assert f(e).shape == (0, 1024)
    finally:
        torch.set_num_threads(before)
