"""A short row held in registers across its passes (`Kernel.register_row`, `strategy.register_row`,
codegen/cpp/regrows.py): chosen where more than 2 x LANE_VECTORS whole vectors of the row fit half
the vector registers (AVX-512: 144 to 256 floats; never at AVX2), passes of fp32 adds, subtracts,
multiplies and sums only, no streamed stores (fewer than 2 x ROW_GROUP rows walk rows). LayerNorm and
RMSNorm against eager at 8 and prime row counts, 9 / 11 / 16 vectors a row, and bit for bit against
the row-group kernel they replace; an output shifted one float off its alignment."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen import native_helpers
from tests.codegen.kernel_graphs import layer_norm_graph, norm_graph
from tests.codegen.native_helpers import check, hand_plan
from tests.fusion.fusion_patterns import FIXED_CPU
from tests.kernel_families import tiers_here

import vfuse.schedule.strategy as strategy
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.ir import Graph
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel, Walk
from vfuse.targets import get_target
from vfuse.targets.isa import Isa

ZEN4 = dataclasses.replace(FIXED_CPU, simd_lanes=16, l1_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)


def _kernel(graph: Graph, target: object) -> Kernel:
    """The one plain kernel of `graph` fused whole, scheduled for `target`."""
    kernels = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target).kernels
    return next(k for k in kernels if isinstance(k, Kernel))


def test_held_where_the_row_fills_half_the_registers() -> None:
    k = _kernel(layer_norm_graph(8192, 256), ZEN4)
    assert k.walk is Walk.ROW_GROUPS and k.register_row == 16 and k.prefetch is not None
    assert _kernel(norm_graph("rms", 1031, 144)[0], ZEN4).register_row == 16  # 9 vectors
    # 8 vectors: row groups (latency); 32 ymm at AVX2 do not fit; 200 is no whole vectors.
    assert _kernel(layer_norm_graph(8192, 128), ZEN4).register_row == 0
    assert _kernel(layer_norm_graph(8192, 256), dataclasses.replace(ZEN4, simd_lanes=8)).register_row == 0
    assert _kernel(layer_norm_graph(8192, 200), ZEN4).register_row == 0
    # LayerNorm + GELU (an op not rendered on vectors) and streamed stores keep the row groups.
    assert _kernel(norm_graph("layernorm", 8192, 256)[0], ZEN4).register_row == 0
    streamed = _kernel(layer_norm_graph(8192, 256), dataclasses.replace(ZEN4, l3_bytes=1 << 20))
    assert streamed.stream and streamed.register_row == 0


@pytest.fixture
def _avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    if Isa.AVX512 not in tiers_here():
        pytest.skip("needs the avx512 tier")
    cpu = dataclasses.replace(get_target("cpu", isa=Isa.AVX512), l2_bytes=1 << 20, l3_bytes=32 << 20)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


def _graph(kind: str, n: int, d: int) -> tuple[Graph, object]:
    if kind == "layernorm":
        return layer_norm_graph(n, d), lambda x, w, b: F.layer_norm(x, (d,), w, b)
    return norm_graph("rms", n, d)


@pytest.mark.usefixtures("_avx512")
@pytest.mark.parametrize("kind", ["layernorm", "rms"])
@pytest.mark.parametrize(("n", "d"), [(8, 256), (11, 144), (13, 176), (1031, 256)])
def test_held_rows_match_eager_and_the_row_groups(monkeypatch: pytest.MonkeyPatch, kind: str, n: int, d: int) -> None:
    graph, ref = _graph(kind, n, d)
    gen = torch.Generator().manual_seed(n * d)
    # Rows whose mean is far from 0 (the two-pass variance's case).
    x = torch.randn(n, d, generator=gen) * 3 + torch.randn(n, 1, generator=gen) * 10
    xs = [x, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    plan = hand_plan(graph, [[nd.name for nd in graph.compute_nodes]])
    ex = check(graph, xs, plan)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.register_row == 16 and "typedef float vr_t" in ex.source and "_rg[" not in ex.source
    got = ex(xs)[0]
    torch.testing.assert_close(got, ref(*xs), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(strategy, "register_row", lambda k, vector: 0)
    groups = check(graph, xs, plan)
    assert "_rg[" in groups.source
    assert torch.equal(groups(xs)[0], got)  # the same statements, the same sums: the same bits


@pytest.mark.usefixtures("_avx512")
def test_held_rows_store_off_alignment() -> None:
    n, d = 37, 256
    graph, ref = _graph("layernorm", n, d)
    xs = [torch.randn(n, d) * 2 + 1, torch.randn(d), torch.randn(d)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    assert "typedef float vr_t" in ex.source
    first = ex(xs)[0]
    (slot,) = [i for i, p in enumerate(ex._ptrs) if p == first.data_ptr()]
    store = torch.full((n * d + 64,), float("nan"))
    base = (-store.data_ptr() // 4) % 16 + 1  # one float past a 64-byte boundary
    out = store[base : base + n * d].view(n, d)
    ex._ptrs[slot] = out.data_ptr()
    (seg,) = ex.program.segments
    assert ex._entries[seg.name](ex._ptrs, ex._arena.data_ptr() + ex._arena_off, ex._seeds.data_ptr(), 2) == 0
    torch.testing.assert_close(out, ref(*xs), rtol=1e-5, atol=1e-5)
    assert store[:base].isnan().all() and store[base + n * d :].isnan().all()


@pytest.mark.usefixtures("_avx512")
def test_held_rows_compile_to_vector_fmas(tmp_path: Path) -> None:
    """The affine step's element loop over a 16-lane value (`vf_fmaf` per lane) is 16 vector fmas
    per row: g++'s tunings of Intel cores prefer 256-bit vectors and made it 255 scalar fmas with
    lane inserts (LayerNorm 8192 x 256 at 2.7x the AVX2 build's time on a Xeon; the AVX-512 tier
    now builds with -mprefer-vector-width=512)."""
    graph, _ = _graph("layernorm", 8192, 256)
    xs = [torch.randn(8192, 256), torch.randn(256), torch.randn(256)]
    ex = check(graph, xs, hand_plan(graph, [[nd.name for nd in graph.compute_nodes]]))
    assert "typedef float vr_t" in ex.source
    cpp = tmp_path / "k.cpp"
    cpp.write_text(ex.source)
    tc = find_toolchain(isa=Isa.AVX512)
    flags = [f for f in tc.flags if f != "-shared"]
    subprocess.run([tc.cxx, *flags, "-S", str(cpp), "-o", str(tmp_path / "k.s")], check=True)
    asm = (tmp_path / "k.s").read_text()
    assert len(re.findall(r"\bvfn?madd\d+ps\b", asm)) >= 16
    assert len(re.findall(r"\bvfn?madd\d+ss\b", asm)) < 16, "the lanes' fmas came out scalar"
