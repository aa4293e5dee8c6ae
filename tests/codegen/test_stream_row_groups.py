"""Short rows whose stores stream (2 LLCs of them, `nest.with_streaming`) are walked in row groups as
the rows below that are (`strategy.use_row_groups`): LayerNorm 65536x256 fell back to one row at a
time there. Decisions at a Zen 3 and a large-L2 target; LayerNorm and RMSNorm against eager through
the streamed row groups on a target whose LLC is a few rows (partial groups, one group, odd rows)."""

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

import vfuse
from vfuse.ir import Graph
from vfuse.schedule import build
from vfuse.schedule.kernel import Kernel, Walk
from vfuse.schedule.strategy import ROW_GROUP
from vfuse.targets import get_target

ZEN3 = dataclasses.replace(FIXED_CPU, simd_lanes=8, l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20)
BIG_L2 = dataclasses.replace(FIXED_CPU, simd_lanes=16, l2_bytes=1 << 20, l3_bytes=32 << 20)  # no group rule


def _kernel(graph: Graph, target: object) -> Kernel:
    prog = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target)
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    return k


@pytest.mark.parametrize("target", [ZEN3, BIG_L2], ids=["zen3", "big_l2"])
@pytest.mark.parametrize("rows", [65536, 131072 + 3])
def test_streamed_short_rows_walk_in_groups(target: object, rows: int) -> None:
    k = _kernel(layer_norm_graph(rows, 256), target)
    assert k.stream and k.walk is Walk.ROW_GROUPS and k.row_group == ROW_GROUP
    lanes = min(target.simd_lanes, 8)
    assert [p.stream_lanes for p in k.passes] == [0, 0, lanes] and k.passes[2].group_columns == lanes
    # Long rows stay one at a time, streamed or not.
    assert _kernel(layer_norm_graph(rows // 4, 1024), target).walk is Walk.ROWS


@pytest.fixture
def _few_rows_llc(monkeypatch: pytest.MonkeyPatch) -> None:
    # An LLC of 16 KiB on a large-L2 core: 2 LLCs of stores are 32 rows of 256 floats, so these
    # kernels stream by the general rule alone (not the small-L2 row groups' own).
    cpu = dataclasses.replace(get_target("cpu"), l2_bytes=1 << 20, l3_bytes=16 << 10)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


@pytest.mark.usefixtures("_few_rows_llc")
@pytest.mark.parametrize("n", [32, 37, 8 * ROW_GROUP + ROW_GROUP - 1, 257])
@pytest.mark.parametrize("kind", ["layernorm", "rms"])
def test_streamed_row_groups_match_eager(kind: str, n: int) -> None:
    graph, eager = norm_graph(kind, n, 256)
    gen = torch.Generator().manual_seed(n)
    xs = [torch.randn(n, 256, generator=gen) * 4 + 1, torch.randn(256, generator=gen), torch.randn(256, generator=gen)]
    xs[0][n - 1, 5] = float("nan")  # the last, maybe partial, group
    ex = check(graph, xs, hand_plan(graph, [[x.name for x in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.stream and k.walk is Walk.ROW_GROUPS, (k.walk, k.stream)
    assert "_rg[" in ex.source
    got = ex(xs)[0]
    torch.testing.assert_close(got, eager(*xs), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert got[n - 1].isnan().all() and not got[: n - 1].isnan().any()


def test_layer_norm_65536_rows_through_compile() -> None:
    x = torch.randn(65536, 256)
    w, b = torch.randn(256), torch.randn(256)
    g = vfuse.compile(lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, b))
    (k,) = [k for k in g.compiled.executor.program.kernels if isinstance(k, Kernel)]
    assert k.walk is Walk.ROW_GROUPS
    torch.testing.assert_close(g(x, w, b), F.layer_norm(x, (256,), w, b), rtol=1e-5, atol=1e-5)


def test_symbolic_rows_keep_the_stream_gate_in_groups(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A first call over 2 LLCs of stores (the hint) must not stream every later call: row groups keep
    # the per-call gate (one flag), calls on both sides run and match eager.
    from vfuse.codegen.cpp.streaming import STREAM_FLAG

    # A large L2 (no half-LLC group rule) and a 256 KiB LLC: 2 LLCs of stores are 512 rows of 256.
    big_l2 = dataclasses.replace(get_target("cpu"), l2_bytes=1 << 20, l3_bytes=256 << 10)
    shapes = [1500, 37, 700, 511, 2051]
    program, source = rendered_layernorm(monkeypatch, tmp_path, big_l2, shapes)
    (k,) = [k for k in program.kernels if isinstance(k, Kernel)]  # type: ignore[attr-defined]
    assert k.walk is Walk.ROW_GROUPS and k.stream and k.stream_gate is not None
    assert f"const bool {STREAM_FLAG} =" in source
    env = k.stream_gate.moved.env
    moved = [env.evaluator(k.stream_gate.moved.expr)(rows) for rows in shapes]
    assert min(moved) < k.stream_gate.limit <= max(moved)
