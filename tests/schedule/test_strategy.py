"""The schedule decides how every kernel is walked and vectorized (schedule/strategy.py) and the
printer (05_program.txt) shows each decision: walk, threads, tiles, row groups, prefetch,
streaming, tables, and per pass the reduction strategy with its numbers and the row facts.
Decisions follow the target's vector width. Built only, not compiled."""

from __future__ import annotations

import dataclasses

from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import hand_plan, inputs, scalar
from tests.fusion.fusion_patterns import FIXED_CPU

from vfuse.fusion import FusionPlan, plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.schedule import build
from vfuse.schedule.kernel import Accumulate, Kernel, Program, Reduction, Walk
from vfuse.schedule.printer import format_kernel
from vfuse.targets import Target

F32 = DType.F32
AVX512 = FIXED_CPU  # so that decisions do not depend on the machine the tests run on
AVX2 = dataclasses.replace(AVX512, simd_lanes=8)


def _kernels(graph: Graph, plan: FusionPlan | None = None, target: Target = AVX512) -> tuple[Program, list[Kernel]]:
    prog = build(plan or hand_plan(graph, [[n.name for n in graph.compute_nodes]]), target)
    return prog, [k for k in prog.kernels if isinstance(k, Kernel)]


def _norm(kind: str, n: int, d: int, target: Target = AVX512) -> tuple[Kernel, str]:
    graph, _ = norm_graph(kind, n, d)
    _, (k,) = _kernels(graph, target=target)
    return k, format_kernel(k)


def test_long_rows_prefetch_and_take_strips() -> None:
    k, text = _norm("layernorm", 8192, 1024)
    assert k.walk is Walk.ROWS and k.threaded and k.prefetch is not None
    # 48 KiB of L1: half of it holds x's, the weight's, the bias's and the output's rows and 2 ahead.
    assert k.prefetch.distance == 2 and k.prefetch.row_bytes == 4096
    (pl,) = k.prefetch.loads  # x only, not the broadcast weights
    assert pl.step == 16 and pl.shares == ((0, 336), (336, 672), (672, 1024))
    mean, var, norm = (p.reduction for p in k.passes)
    assert mean == Reduction(Accumulate.STRIPS, 1024, chains=4, vector=16)  # a first pass: FIRST_CHAINS
    assert var == Reduction(Accumulate.STRIPS, 1024, chains=8, vector=16)
    assert norm.kind is Accumulate.NONE and all(p.serial for p in k.passes)
    assert "walk rows, threaded, prefetch 2 rows ahead (locality 3): %x0 every 16 elements, 0:336 | 336:672" in text
    assert "strips, 4 chain(s) x 16 lanes, block 1024" in text and "strips, 8 chain(s) x 16 lanes" in text


def test_row_prefetch_only_where_l1_holds_the_rows_in_flight() -> None:
    # softmax keeps x's row, its row buffer and the output's in L1: 3 rows ahead fit beside them in
    # half of 48 KiB; in half of 32 KiB one row would (too little lead: none), LayerNorm's none.
    sm, _ = _norm("softmax", 8192, 1024)
    assert sm.prefetch is not None and sm.prefetch.distance == 3
    small = dataclasses.replace(AVX512, l1_bytes=32 << 10)
    for kind in ("softmax", "layernorm"):
        k, text = _norm(kind, 8192, 1024, small)
        assert k.walk is Walk.ROWS and k.prefetch is None and "prefetch" not in text
        assert k.passes[0].reduction.kind is Accumulate.SIMD  # an unprefetched first pass keeps one chain
    # At 8 lanes an unprefetched first pass takes two chains (one 512-bit vector per step); the
    # max of softmax tracks NaN and keeps the plain SIMD reduction.
    small2 = dataclasses.replace(AVX2, l1_bytes=32 << 10)
    ln, _ = _norm("layernorm", 8192, 1024, small2)
    assert ln.prefetch is None and ln.passes[0].reduction == Reduction(Accumulate.STRIPS, 1024, chains=2, vector=8)
    sm, _ = _norm("softmax", 8192, 1024, small2)
    assert sm.prefetch is None and sm.passes[0].reduction.kind is Accumulate.SIMD
    # Rows of 4096 floats fill half of even 48 KiB on their own.
    k, _ = _norm("layernorm", 512, 4096)
    assert k.prefetch is None


def test_short_rows_walk_in_groups_with_lanes() -> None:
    k, text = _norm("layernorm", 64, 256)
    assert k.walk is Walk.ROW_GROUPS and k.row_group == 4 and k.prefetch is None and not k.threaded
    assert k.passes[0].reduction == Reduction(Accumulate.LANES, 1024, lanes=64, whole_row=True)
    assert "walk row groups, one thread, 4 rows per group" in text and "accumulate 64 lanes, whole row" in text


def test_row_groups_prefetch_rows_ahead_where_l1_holds_them() -> None:
    # 8 KiB of rows ahead (8 rows of 1 KiB) beside the group's 10 KiB in use (4 rows of x and of the
    # output, weight and bias once) fit in 60 % of 32 KiB, at either width; 64 KiB inputs (above) stay
    # in L2: none. Each pass's row loop prefetches its share of the row 8 ahead.
    for target in (AVX512, AVX2):
        k, text = _norm("layernorm", 8192, 256, dataclasses.replace(target, l1_bytes=32 << 10))
        assert k.walk is Walk.ROW_GROUPS and k.prefetch is not None and k.prefetch.distance == 8
        (pl,) = k.prefetch.loads  # x only, not the broadcast weights
        assert pl.step == 16 and pl.shares == ((0, 80), (80, 160), (160, 256))
        assert "walk row groups, threaded, 4 rows per group, prefetch 8 rows ahead (locality 3)" in text
    # 128-element rows (512 bytes) keep up without; in 16 KiB of L1 the group's own rows leave no room.
    k, _ = _norm("layernorm", 16384, 128, dataclasses.replace(AVX512, l1_bytes=32 << 10))
    assert k.walk is Walk.ROW_GROUPS and k.prefetch is None
    k, _ = _norm("layernorm", 8192, 256, dataclasses.replace(AVX512, l1_bytes=16 << 10))
    assert k.walk is Walk.ROW_GROUPS and k.prefetch is None


def test_softmax_row_facts_and_nan_tracking_max() -> None:
    k, text = _norm("softmax", 8192, 1024)
    mx, expsum, div = k.passes
    assert mx.reduction.kind is Accumulate.SIMD  # max tracks NaN in a flag: no strips
    assert expsum.reduction.chains == 1 and expsum.nonpos and not expsum.recips  # exp: one chain
    assert div.recips == (expsum.reduces[0].var,)
    assert f"<= 0: {expsum.nonpos[0]}" in text and f"reciprocal of {div.recips[0]}" in text


def test_column_reduction_tiles_columns() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((300, 257), F32))
    _, (k,) = _kernels(b.build([b.add(Op.SUM, [x], axes=(0,), keepdim=False)]))
    assert k.walk is Walk.TILED_COLUMNS and k.tile == 64
    assert k.passes[0].reduction == Reduction(Accumulate.SIMD, 1024)
    assert "walk tiled columns, threaded, tile 64 columns" in format_kernel(k)


def test_multi_axis_reductions() -> None:
    # Over dims 0 and 2, the innermost kept: columns. Over dims 1 and 3: rows of two loops,
    # so lanes could only ever be one partial among several (never the whole row).
    b = GraphBuilder()
    (x,) = inputs(b, ((5, 6, 7, 8), F32))
    outs = [b.add(Op.SUM, [x], axes=(0, 2), keepdim=False), b.add(Op.AMAX, [x], axes=(1, 3), keepdim=False)]
    _, kernels = _kernels(b.build(outs), plan_fusion(b.build(outs), AVX512))
    walks = {k.passes[0].reduces[0].op: k for k in kernels}
    assert walks[Op.SUM].walk is Walk.TILED_COLUMNS
    rows = walks[Op.AMAX]
    assert rows.walk is Walk.ROWS and len(rows.inner) == 2 and rows.passes[0].reduction.kind is Accumulate.SIMD
    assert "walk rows, one thread" in format_kernel(rows) and "accumulate simd, block 1024" in format_kernel(rows)


def test_index_reduction_runs_in_order() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((37, 500), F32))
    graph = b.build([b.add(Op.ARGMAX, [x], axes=(1,), keepdim=False)])
    _, (k,) = _kernels(graph)
    assert k.passes[0].reduction.kind is Accumulate.IN_ORDER and k.passes[0].serial
    assert "accumulate in order; serial" in format_kernel(k)


def test_lookup_table_and_flat_loop() -> None:
    b = GraphBuilder()
    (q,) = inputs(b, ((1000, 1000), DType.U8))
    x = b.add(Op.MUL, [b.add(Op.SUB, [b.add(Op.CAST, [q], dtype=F32), scalar(b, 3.0)]), scalar(b, 0.05)])
    graph = b.build([b.add(Op.SIGMOID, [b.add(Op.EXP, [x])])])
    _, (k,) = _kernels(graph, plan_fusion(graph, AVX512))
    assert k.walk is Walk.LOOKUP_TABLE and k.table_flat and k.threaded
    assert f"walk lookup table, threaded, table of %{k.table}, one flat loop" in format_kernel(k)


def test_outputs_larger_than_the_llc_stream() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((2000, 3000), F32), ((2000, 3000), F32))
    graph = b.build([b.add(Op.ADD, [x, y])])
    small_llc = dataclasses.replace(AVX512, l3_bytes=4 << 20)  # 24 MB out: several LLCs
    _, (k,) = _kernels(graph, plan_fusion(graph, small_llc), small_llc)
    assert k.walk is Walk.SINGLE_ROW and k.stream and k.passes[0].streamed and not k.passes[0].serial
    assert "walk single row, threaded, streamed stores" in format_kernel(k) and "; streamed" in format_kernel(k)
    _, (plain,) = _kernels(graph, plan_fusion(graph, AVX512))
    assert not plain.stream and "stream" not in format_kernel(plain)


def test_decisions_follow_the_vector_width() -> None:
    # AVX2: 8 fp32 lanes per vector, so 32 lanes, strips over 8 lanes, tiles of 32 columns;
    # row groups for rows up to 256 elements (lanes up to 4 x 32), rows walked one at a time past it.
    k, text = _norm("layernorm", 64, 100, AVX2)
    assert k.walk is Walk.ROW_GROUPS and k.passes[0].reduction.lanes == 32 and "accumulate 32 lanes" in text
    k, _ = _norm("layernorm", 64, 256, AVX2)  # lanes up to 256 elements in 8 steps of 32
    assert k.walk is Walk.ROW_GROUPS and k.passes[1].reduction == Reduction(
        Accumulate.LANES, 1024, lanes=32, whole_row=True
    )
    k, _ = _norm("layernorm", 64, 200, dataclasses.replace(AVX512, simd_lanes=4))  # 16 lanes: 8 steps at most
    assert k.walk is Walk.ROW_GROUPS and k.passes[1].reduction.kind is Accumulate.STRIPS
    k, _ = _norm("layernorm", 64, 257, AVX2)
    assert k.walk is Walk.ROWS
    b = GraphBuilder()
    (x,) = inputs(b, ((300, 257), F32))
    prog, (col,) = _kernels(b.build([b.add(Op.SUM, [x], axes=(0,), keepdim=False)]), target=AVX2)
    assert col.tile == 32 and prog.vector_width == 8
