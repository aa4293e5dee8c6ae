"""GPU launch decisions (schedule/gpu.py): walk, tile, persistence, warps, grid, 64-bit offsets,
index-check blocks, per preset; printed in 05_program.txt; contractions through torch without
templates. Built only (no triton needed): shapes past 2^31 elements cost nothing here."""

from __future__ import annotations

from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import hand_plan, inputs

from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.schedule import TorchStep, build
from vfuse.schedule.kernel import GpuLaunch, GpuWalk, Kernel
from vfuse.schedule.printer import format_kernel
from vfuse.targets import get_target

F32 = DType.F32
H100, A100 = get_target("h100"), get_target("a100")


def _kernels(graph: Graph, target: object = H100) -> list[Kernel]:
    prog = build(hand_plan(graph, [[n.name for n in graph.compute_nodes]]), target)
    return [k for k in prog.kernels if isinstance(k, Kernel)]


def _launch(graph: Graph, target: object = H100) -> GpuLaunch:
    (k,) = _kernels(graph, target)
    assert k.gpu is not None
    return k.gpu


def _pointwise(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder()
    x, y = inputs(b, (shape, F32), ((shape[-1],), F32))
    return b.build([b.add(Op.RELU, [b.add(Op.ADD, [x, y])])])


def test_pointwise_is_flat_blocks_of_the_table() -> None:
    g = _launch(_pointwise((37, 41)))
    # 1517 elements: two programs of 1024, the first mask-free (1517 is odd: a masked program's
    # accesses would be scalar)
    assert g == GpuLaunch(GpuWalk.FLAT, 1024, 1, 2, 4, unmasked=1)
    assert _launch(_pointwise((3, 5))) == GpuLaunch(GpuWalk.FLAT, 16, 1, 1, 1)  # a block no wider than needed


def test_flat_full_blocks_run_mask_free_where_a_mask_would_break_vector_accesses() -> None:
    def launch(shape: tuple[int, ...], dtype: DType = F32) -> tuple[int, int]:
        b = GraphBuilder()
        x, y = inputs(b, (shape, dtype), ((shape[-1],), dtype))
        g = _launch(b.build([b.add(Op.RELU, [b.add(Op.ADD, [x, y])])]))
        return g.programs, g.unmasked

    assert launch((4, 1024)) == (4, 4)  # no tail: every program mask-free
    assert launch((1, 1)) == (1, 1)  # one element: one full block of 1
    assert launch((1, 2053)) == (3, 2)  # odd: the tail program alone is masked
    assert launch((2, 1026)) == (3, 0)  # 2052 = 4 x 513: the mask is constant per 4 fp32 lanes already
    assert launch((2, 1026), DType.BF16) == (3, 2)  # but not per 8 bf16 lanes (a 16-byte vector)
    (k,) = _kernels(_pointwise((1, 2053)), H100)
    assert "3 programs, 2 mask-free, the tail masked" in format_kernel(k)


def test_rows_that_fit_are_persistent_and_short_rows_share_programs_on_big_grids() -> None:
    small = _launch(norm_graph("layernorm", 96, 200)[0])
    # 96 rows are fewer than 2 programs per SM (2 x 132): one row per program.
    assert (small.walk, small.block, small.rows, small.programs, small.persistent) == (GpuWalk.ROWS, 256, 1, 96, True)
    big = _launch(norm_graph("layernorm", 65536, 1024)[0])
    assert (big.block, big.rows, big.programs, big.warps, big.persistent) == (1024, 4, 16384, 16, True)


def test_rows_past_the_persistent_limit_are_walked_in_chunks_per_pass() -> None:
    g = _launch(norm_graph("softmax", 64, 9000)[0])
    assert (g.walk, g.block, g.persistent) == (GpuWalk.ROWS, 2048, False)
    assert _launch(norm_graph("softmax", 64, 8192)[0]).persistent


def test_the_preset_sm_count_sets_rows_per_program() -> None:
    graph = norm_graph("rms", 500, 200)[0]
    assert (_launch(graph, H100).rows, _launch(graph, A100).rows) == (1, 2)  # 2 x 132 vs 2 x 108 programs


def test_column_reductions_tile_adjacent_columns() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((257, 33), F32))
    g = _launch(b.build([b.add(Op.SUM, [x], axes=(0,), keepdim=False)]))
    assert (g.walk, g.rows, g.block, g.programs, g.persistent) == (GpuWalk.COLUMNS, 16, 256, 3, False)


def test_64_bit_offsets_only_past_2_31_elements() -> None:
    assert not _launch(_pointwise((1 << 15, 1 << 16))).wide  # 2^31 - 1 is the last int32 index
    assert _launch(_pointwise((1 << 15, (1 << 16) + 1))).wide
    b = GraphBuilder()
    table, idx = inputs(b, (((1 << 26) + 1, 32), F32), ((5,), DType.I64))
    out = b.add(Op.EMBEDDING, [table, idx])
    (k,) = _kernels(b.build([out]))
    assert k.gpu is not None and k.gpu.wide  # a gathered row may be anywhere in the table
    assert k.gpu.check_block == 8  # the index buffer (5 indices) checked in one small block


def test_printer_shows_the_gpu_launch_and_cpu_targets_have_none() -> None:
    (k,) = _kernels(norm_graph("softmax", 64, 9000)[0])
    assert "gpu rows, 1 rows x 2048 per program (looped per pass), 8 warps, 64 programs" in format_kernel(k)
    (cpu,) = _kernels(norm_graph("softmax", 64, 9000)[0], get_target("cpu"))
    assert cpu.gpu is None and "gpu" not in format_kernel(cpu)


def test_without_templates_contractions_run_through_torch_and_the_epilogue_is_a_kernel() -> None:
    b = GraphBuilder()
    x, w = inputs(b, ((8, 16), F32), ((16, 4), F32))
    out = b.add(Op.RELU, [b.add(Op.MATMUL, [x, w])])
    graph = b.build([out])
    prog = build(hand_plan(graph, [[n.name for n in graph.compute_nodes]]), H100, templates=False)
    torch_steps = [s for s in prog.steps if isinstance(s, TorchStep)]
    assert [s.reason for s in torch_steps] == ["contraction through torch: no template for this backend"]
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    assert k.gpu is not None and k.gpu.walk is GpuWalk.FLAT
