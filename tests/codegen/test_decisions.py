"""The C++ renderer only renders what the schedule decided (schedule/strategy.py): it imports no
deciding module, a Program whose decisions are changed by hand renders accordingly and still
computes eager's numbers, and a target of another vector width (AVX2: 8 fp32 lanes) gets
lanes, strips and tiles of its own width that compute the same numbers."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import hand_plan, inputs, target

import vfuse.codegen.cpp
from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.fusion import FusionPlan
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.runtime.native import NativeExecutor
from vfuse.schedule import build
from vfuse.schedule.blocks import Blocking, CallBlocks, ConvBlocks
from vfuse.schedule.choices import kernel_choices
from vfuse.schedule.kernel import Accumulate, ContractionKernel, Kernel, Pass, Program, Reduction, Segment, Walk
from vfuse.schedule.strategy import lanes
from vfuse.targets.isa import Isa, IsaExtra

# What a renderer may read of the schedule: its data and index expressions, no decision. The GEMM/conv
# templates also read schedule.microtile and schedule.blocks, for their VectorUnit, Blocking and
# CallBlocks types and the default register tile and cache blocks of a template rendered outside a
# Program (template tests); a Program's are ContractionKernel.mr/nr and .gemm_blocks.
SCHEDULE_DATA = {"vfuse.schedule.kernel", "vfuse.schedule.expr", "vfuse.schedule.microtile", "vfuse.schedule.blocks"}


def _schedule_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vfuse.schedule"):
            out |= (
                {node.module} if node.module != "vfuse.schedule" else {f"vfuse.schedule.{a.name}" for a in node.names}
            )
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("vfuse.schedule")}
    return out


def test_renderer_imports_no_schedule_decisions() -> None:
    root = Path(vfuse.codegen.cpp.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    for f in files:
        assert _schedule_imports(f) <= SCHEDULE_DATA, f"{f.relative_to(root)} imports {_schedule_imports(f)}"


# Size choices a renderer must not make: taking a symbolic size at its hint, or proving a relation
# of sizes, is deciding (schedule/gates.py, the schedule's `hint`s). Files that still do, and why.
AT_SIZES = {"hint", "proved"}
STILL_DECIDING: dict[str, set[str]] = {}


def _sym_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = (
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "vfuse.ir.sym" for a in n.names
    )
    return set(found) & AT_SIZES


def test_renderers_take_no_size_at_its_hint() -> None:
    """The tiled transposes' prefetch (which runs, how long), the row prefetch's empty shares: the
    schedule's (`TransposeTiles.prefetches`, `PrefetchLoad.live`); a renderer importing `hint` or
    `proved` again decides on sizes."""
    root = Path(vfuse.codegen.cpp.__file__).parent
    deciding = {f.name: _sym_imports(f) for f in sorted(root.rglob("*.py")) if _sym_imports(f)}
    assert deciding == STILL_DECIDING


def _one(graph: Graph) -> FusionPlan:
    return hand_plan(graph, [[n.name for n in graph.compute_nodes]])


def _edit(program: Program, edit: Callable[[Kernel], Kernel]) -> Program:
    steps = tuple(
        dataclasses.replace(s, kernels=tuple(edit(k) if isinstance(k, Kernel) else k for k in s.kernels))
        if isinstance(s, Segment)
        else s
        for s in program.steps
    )
    return dataclasses.replace(program, steps=steps)


def _passes(k: Kernel, edit: Callable[[int, Pass], Pass]) -> Kernel:
    return dataclasses.replace(k, passes=tuple(edit(i, p) for i, p in enumerate(k.passes)))


def _load(plan: FusionPlan, program: Program) -> NativeExecutor:
    ctx = Context(Options.from_env())
    source = compiler.render(program, ctx)
    return compiler.load(plan, program, source, compiler.build(source, program, ctx), ctx)


def _kernel_source(ex: NativeExecutor) -> str:
    return ex.source[ex.source.index("// group 0") :]


def _check_norm(ex: NativeExecutor, kind: str, n: int, d: int) -> None:
    _, eager = norm_graph(kind, n, d)
    gen = torch.Generator().manual_seed(n * d)
    xs = [torch.randn(n, d, generator=gen) * 3 + 1, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)


def test_fewer_chains_and_a_shorter_prefetch_render_as_decided() -> None:
    graph, _ = norm_graph("layernorm", 16, 1024)
    plan = _one(graph)
    prog = build(plan, dataclasses.replace(target(), l1_bytes=48 << 10))  # room for prefetched rows
    (k,) = prog.kernels
    assert isinstance(k, Kernel) and k.prefetch and k.passes[1].reduction.chains == 8
    fewer = dataclasses.replace(k.passes[1].reduction, chains=2)
    prog = _edit(prog, lambda k: _passes(k, lambda i, p: dataclasses.replace(p, reduction=fewer) if i == 1 else p))
    prog = _edit(prog, lambda k: dataclasses.replace(k, prefetch=dataclasses.replace(k.prefetch, distance=1)))
    ex = _load(plan, prog)
    src = _kernel_source(ex)
    mean, var = (p.reduces[0].var for p in k.passes[:2])
    assert f"{var}_q1;" in src and f"{var}_q2;" not in src and f"{mean}_q3;" in src  # 2 chains; mean still 4
    assert "const int64_t i0_pf = i0 + 1 < 16 ? i0 + 1 : 15;" in src
    _check_norm(ex, "layernorm", 16, 1024)


def test_rows_one_at_a_time_without_lanes_render_as_decided() -> None:
    d = 3 * lanes(target().simd_lanes) + 8  # rows of lanes and row groups at this vector width (200 at 16 lanes)
    graph, _ = norm_graph("layernorm", 33, d)
    plan = _one(graph)
    prog = build(plan, target())
    (k,) = prog.kernels
    assert isinstance(k, Kernel) and k.walk is Walk.ROW_GROUPS and k.passes[0].reduction.kind is Accumulate.LANES
    simd = Reduction(Accumulate.SIMD, 1024)
    prog = _edit(prog, lambda k: dataclasses.replace(k, walk=Walk.ROWS, row_group=0))
    prog = _edit(prog, lambda k: _passes(k, lambda i, p: dataclasses.replace(p, reduction=simd) if p.reduces else p))
    ex = _load(plan, prog)
    src = _kernel_source(ex)
    assert "_rg[" not in src and "_ln[" not in src and "_blk)" in src
    _check_norm(ex, "layernorm", 33, d)


def test_softmax_without_row_facts_renders_as_decided() -> None:
    graph, _ = norm_graph("softmax", 6, 1000)
    plan = _one(graph)
    prog = build(plan, target())
    prog = _edit(prog, lambda k: _passes(k, lambda i, p: dataclasses.replace(p, recips=(), nonpos=())))
    ex = _load(plan, prog)
    src = _kernel_source(ex)
    assert "_rcp" not in src and "vf_exp_nonpos(" not in src and " / " in src
    _check_norm(ex, "softmax", 6, 1000)


AVX2 = dataclasses.replace(target(), simd_lanes=8, l1_bytes=48 << 10)  # 48 KiB: rows prefetched


@pytest.mark.parametrize(
    ("kind", "n", "d", "marks"),
    [
        ("layernorm", 64, 100, ["_ln[32]", "_rg["]),  # 32 lanes, row groups (rows up to 128)
        ("layernorm", 16, 1024, ["sl < 8;", "_sp[8]", "__builtin_prefetch"]),  # strips over 8 lanes
        ("softmax", 9, 1000, ["sl < 8;", "vf_exp_nonpos("]),
    ],
)
def test_avx2_width_computes_right(kind: str, n: int, d: int, marks: list[str]) -> None:
    graph, _ = norm_graph(kind, n, d)
    plan = _one(graph)
    program = build(plan, AVX2)
    assert program.vector_width == 8
    ex = _load(plan, program)
    src = _kernel_source(ex)
    assert all(m in src for m in marks), [m for m in marks if m not in src]
    assert "_ln[64]" not in src and "sl < 16;" not in src
    _check_norm(ex, kind, n, d)


def test_avx2_column_tile_computes_right() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((300, 77), DType.F32))
    graph = b.build([b.add(Op.SUM, [x], axes=(0,), keepdim=False)])
    plan = _one(graph)
    ex = _load(plan, build(plan, AVX2))
    assert "cb += 32)" in ex.source
    xs = torch.randn(300, 77)
    torch.testing.assert_close(ex([xs])[0], xs.sum(0), rtol=1e-5, atol=1e-4)


def _transpose_chain(n: int, m: int) -> Graph:
    """relu(x.t() + y) * sigmoid(y), x: n x m, y: m x n (a tiled transpose)."""
    b = GraphBuilder()
    x, y = inputs(b, ((n, m), DType.F32), ((m, n), DType.F32))
    s = b.add(Op.RELU, [b.add(Op.ADD, [b.add(Op.PERMUTE, [x], perm=(1, 0)), y])])
    return b.build([b.add(Op.MUL, [s, b.add(Op.SIGMOID, [y])])])


def _transpose_body(ex: NativeExecutor) -> str:
    src = _kernel_source(ex)
    return src[src.index("const int64_t vne = ") :]  # the next tile's corner: prefetches spread or at the start


@pytest.mark.parametrize("spread", [True, False])
@pytest.mark.parametrize("edit", ["none", "staged only", "longer runs"])
def test_transpose_prefetches_render_as_decided(edit: str, spread: bool) -> None:
    """Which accesses a tiled transpose prefetches and how far along each run are the schedule's
    (`TransposeTiles.prefetches`): a Program edited by hand renders exactly those, and still
    computes eager's numbers (80 x 144 fp32: rows on whole lines, three prefetched accesses), spread
    over the tile's rows or at its start (`TransposeTiles.spread`)."""
    graph = _transpose_chain(144, 80)
    plan = _one(graph)
    prog = build(plan, AVX2)
    (k,) = prog.kernels
    assert isinstance(k, Kernel) and k.transpose is not None and len(k.transpose.prefetches) == 3
    t = k.transpose
    staged = tuple(pf for pf in t.prefetches if getattr(pf.access, "var", None) in t.staged)
    chosen = {
        "none": (),
        "staged only": staged,
        "longer runs": tuple(dataclasses.replace(pf, run=pf.run + 48) for pf in t.prefetches),
    }[edit]
    t = dataclasses.replace(t, prefetches=chosen, spread=spread)
    prog = _edit(prog, lambda k: dataclasses.replace(k, transpose=t))
    ex = _load(plan, prog)
    body = _transpose_body(ex)
    assert body.count("__builtin_prefetch(") == len(chosen)
    for pf in chosen:
        assert f"l < {pf.run}; l += 16" in body
    if chosen:  # a share in each tile row, or all before the tile's first
        assert ("const int64_t r = i0 - ub;" in body) == spread
        assert ("for (int64_t j = 0; j < vne - vn; ++j)" in body) == (not spread)
    x, y = torch.randn(144, 80), torch.randn(80, 144)
    torch.testing.assert_close(ex([x, y])[0], torch.relu(x.t() + y) * torch.sigmoid(y))


def test_gemm_blocks_render_as_decided() -> None:
    """A GEMM's cache blocks are the schedule's (`ContractionKernel.gemm_blocks`): blocks edited by
    hand render as edited (K in blocks of 64, N of 2 slivers) and compute eager's numbers."""
    b = GraphBuilder()
    x, w = inputs(b, ((100, 300), DType.F32), ((300, 70), DType.F32))
    graph = b.build([b.add(Op.RELU, [b.add(Op.MATMUL, [x, w])])])
    plan = _one(graph)
    prog = build(plan, AVX2)
    (k,) = prog.kernels
    assert isinstance(k, ContractionKernel) and k.gemm_blocks is not None
    mine = Blocking(k.mr, k.nr, 4 * k.mr, 64, 2 * k.nr, k.vector)
    assert mine not in k.gemm_blocks.blocks
    prog = _edit_any(prog, lambda k: dataclasses.replace(k, gemm_blocks=CallBlocks(100, (mine,))))
    ex = _load(plan, prog)
    assert "pc += 64)" in ex.source and f"jc += {2 * k.nr})" in ex.source
    xs = [torch.randn(100, 300), torch.randn(300, 70)]
    torch.testing.assert_close(ex(xs)[0], torch.relu(xs[0] @ xs[1]), rtol=1e-4, atol=1e-4)


def _edit_any(program: Program, edit: Callable[[ContractionKernel], ContractionKernel]) -> Program:
    steps = tuple(
        dataclasses.replace(s, kernels=tuple(edit(k) if isinstance(k, ContractionKernel) else k for k in s.kernels))
        if isinstance(s, Segment)
        else s
        for s in program.steps
    )
    return dataclasses.replace(program, steps=steps)


def _contraction_kernel(program: Program) -> ContractionKernel:
    (k,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    return k


def _linear(m: int, k: int, n: int) -> Graph:
    """relu(x @ w.T), x: m x k, w: n x k."""
    b = GraphBuilder()
    x, w = inputs(b, ((m, k), DType.F32), ((n, k), DType.F32))
    return b.build([b.add(Op.RELU, [b.add(Op.MATMUL, [x, b.add(Op.PERMUTE, [w], perm=(1, 0))])])])


@pytest.mark.parametrize(("m", "k", "n"), [(130, 256, 48), (300, 600, 37)])
def test_gemm_a_packing_renders_as_decided(m: int, k: int, n: int) -> None:
    """Whether a GEMM packs all of A once per call is the schedule's (`ContractionKernel.shared_a`):
    flipped by hand, the source packs A once (`_pack_all`) or per block, with eager's numbers."""
    graph = _linear(m, k, n)
    plan = _one(graph)
    prog = build(plan, AVX2)
    once = _contraction_kernel(prog).shared_a
    assert once == (m == 130)  # 130 rows in one block: A would be packed by every thread; 300 x 600: past 512 KiB
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, shared_a=not once))
    ex = _load(plan, prog)
    assert ("_pack_all(" in ex.source) is not once
    x, w = torch.randn(m, k), torch.randn(n, k)
    torch.testing.assert_close(ex([x, w])[0], torch.relu(x @ w.T), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [130, 7, 1])
def test_gemm_thread_split_renders_as_decided(m: int) -> None:
    """Whether threads take rows before columns where M fits one block is the schedule's
    (`CallBlocks.rows_first`; off for a B packed per call): flipped by hand, the source splits
    rows, with eager's numbers at 2 threads, including M of fewer slivers than threads."""
    graph = _linear(m, 256, 48)
    plan = _one(graph)
    prog = build(plan, AVX2)
    blocks = _contraction_kernel(prog).gemm_blocks
    assert blocks is not None and not blocks.rows_first
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, gemm_blocks=dataclasses.replace(blocks, rows_first=True)))
    ex = _load(plan, prog)
    assert "rows first (schedule)" in ex.source
    x, w = torch.randn(m, 256), torch.randn(48, 256)
    torch.set_num_threads(2)
    torch.testing.assert_close(ex([x, w])[0], torch.relu(x @ w.T), rtol=1e-4, atol=1e-4)


def _conv(x: tuple[int, ...], w: tuple[int, ...], stride: int = 1, padding: int = 0) -> Graph:
    b = GraphBuilder()
    xi, wi = inputs(b, (x, DType.F32), (w, DType.F32))
    y = b.add(Op.CONV2D, [xi, wi], stride=(stride, stride), padding=(padding, padding), dilation=(1, 1), groups=1)
    return b.build([b.add(Op.RELU, [y])])


def _check_conv(ex: NativeExecutor, x: tuple[int, ...], w: tuple[int, ...], stride: int = 1, padding: int = 0) -> None:
    xs = [torch.randn(x), torch.randn(w)]
    want = torch.relu(torch.nn.functional.conv2d(*xs, stride=stride, padding=padding))
    torch.testing.assert_close(ex(xs)[0], want, rtol=1e-4, atol=1e-4)


def test_conv_cache_blocks_render_as_decided() -> None:
    """A conv's implicit-GEMM cache blocks are the schedule's (`ContractionKernel.gemm_blocks`, no
    longer taken at the hints by the renderer): K in blocks of 32 and N of one sliver render so."""
    x, w = (2, 72, 9, 11), (40, 72, 1, 1)  # a pointwise conv: the implicit GEMM
    plan = _one(_conv(x, w))
    prog = build(plan, AVX2)
    c = _contraction_kernel(prog)
    assert c.gemm_blocks is not None and c.gemm_blocks.blocks[0].kc == 72
    mine = Blocking(c.mr, c.nr, c.mr, 32, c.nr, c.vector)
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, gemm_blocks=CallBlocks(40, (mine,))))
    ex = _load(plan, prog)
    assert "pc += 32)" in ex.source and f"jc += {c.nr})" in ex.source
    _check_conv(ex, x, w)


def test_direct_conv_channel_blocks_render_as_decided() -> None:
    """The direct conv's input channels per K block and output channels per M block are the
    schedule's (`ConvBlocks.icb` / `.mb`): edited by hand, the loops step by them."""
    x, w = (2, 20, 9, 13), (19, 20, 3, 3)
    plan = _one(_conv(x, w, padding=1))
    prog = build(plan, AVX2)
    c = _contraction_kernel(prog)
    assert c.conv_blocks is not None and (c.conv_blocks.icb, c.conv_blocks.mb) == (20, -(-19 // c.mr) * c.mr)
    mine = dataclasses.replace(c.conv_blocks, icb=7, mb=c.mr)
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, conv_blocks=mine))
    ex = _load(plan, prog)
    assert "conv2d (direct" in ex.source and "ic0 += 7)" in ex.source and f"ir0 += {c.mr})" in ex.source
    _check_conv(ex, x, w, padding=1)


@pytest.mark.parametrize("threaded", [False, True])
def test_folded_conv_threads_render_as_decided(threaded: bool) -> None:
    """The folded weight-gradient template's threaded passes are the schedule's (`ConvBlocks`): a
    small one is serial; forced onto threads it renders so and computes the same numbers."""
    x, w = (3, 8, 10, 10), (4, 8, 8, 8)  # a 3x3 output plane under an 8x8 kernel: folded
    plan = _one(_conv(x, w))
    prog = build(plan, AVX2)
    c = _contraction_kernel(prog)
    assert c.attrs.get("folded") and c.conv_blocks == ConvBlocks()  # serial: 2400 and 108 elements
    mine = ConvBlocks(threaded_transpose=threaded, threaded_scatter=threaded)
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, conv_blocks=mine))
    ex = _load(plan, prog)
    flag = "nth > 1" if threaded else "false"
    assert f"const bool par = {flag};" in ex.source and f"schedule(static) if ({flag})" in ex.source
    _check_conv(ex, x, w)


def _qlinear(m: int, k: int, n: int) -> Graph:
    """relu(dequant(xq) @ dequant(wq).T), int8 operands, per-tensor zero points and scales."""
    b = GraphBuilder()
    xq, wq = inputs(b, ((m, k), DType.I8), ((n, k), DType.I8))

    def deq(v: str, zero: float, scale: float) -> str:
        f = b.add(Op.SUB, [b.add(Op.CAST, [v], dtype=DType.F32), b.add(Op.FULL, value=zero, shape=(), dtype=DType.F32)])
        return b.add(Op.MUL, [f, b.add(Op.FULL, value=scale, shape=(), dtype=DType.F32)])

    y = b.add(Op.MATMUL, [deq(xq, 3.0, 0.02), b.add(Op.PERMUTE, [deq(wq, 0.0, 0.01)], perm=(1, 0))])
    return b.build([b.add(Op.RELU, [y])])


VNNI = dataclasses.replace(
    target(), isa=Isa.AVX512, simd_lanes=16, regs_per_thread=32, isa_extras=frozenset({IsaExtra.VNNI})
)


def test_int8_row_slivers_render_as_decided() -> None:
    """The int8 template's row slivers per work item are the schedule's (`Int8Dot.mcb`, from L2):
    rendered only (this test runs on any CPU; the VNNI kernels' numbers: tests/codegen/gemm/test_int8dot.py)."""
    graph = _qlinear(200, 1024, 64)
    plan = _one(graph)
    prog = build(plan, dataclasses.replace(VNNI, l2_bytes=256 << 10))
    q = _contraction_kernel(prog).int8
    assert q is not None and q.mcb == (256 << 10) // 2 // (q.mr * 1024) and q.mcb < -(-200 // q.mr)
    assert f"ic += {q.mcb})" in vfuse.codegen.cpp.render(prog)
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, int8=dataclasses.replace(q, mcb=3)))
    assert "ic += 3)" in vfuse.codegen.cpp.render(prog)


def test_explain_names_the_template_blocks() -> None:
    """`vfuse explain`'s kernel choices (the flips it reports over symbolic sizes) name each block."""
    gemm = kernel_choices(build(_one(_linear(130, 256, 48)), AVX2))
    assert gemm["k0_c (gemm) A packing"] == "once per call"
    assert gemm["k0_c (gemm) GEMM blocks"] == "M in one block, K in one block, N in one block"
    direct = kernel_choices(build(_one(_conv((2, 20, 9, 13), (19, 20, 3, 3), padding=1)), AVX2))
    assert direct["k0_c (gemm) channel blocks"].startswith("20 in, ") and direct["k0_c (gemm) conv path"] == "direct"
    folded = kernel_choices(build(_one(_conv((3, 8, 10, 10), (4, 8, 8, 8))), AVX2))
    assert folded["k0_c (gemm) threaded passes"] == "none"
    qdot = kernel_choices(build(_one(_qlinear(200, 1024, 64)), VNNI))
    assert qdot["k0_c (gemm) int8 row slivers"].endswith(" per work item")


def test_conv_path_renders_as_decided() -> None:
    """Direct path or implicit GEMM is the schedule's (`ConvBlocks.direct`, within the direct path's
    buffer limits, `conv_columns.direct_fits`): switched off by hand, the conv gathers im2col slivers."""
    x, w = (2, 20, 9, 13), (19, 20, 3, 3)
    plan = _one(_conv(x, w, padding=1))
    prog = build(plan, AVX2)
    c = _contraction_kernel(prog)
    assert c.conv_blocks is not None and c.conv_blocks.direct
    prog = _edit_any(
        prog, lambda c: dataclasses.replace(c, conv_blocks=dataclasses.replace(c.conv_blocks, direct=False))
    )
    ex = _load(plan, prog)
    assert "conv2d (direct" not in ex.source and "_im2col(" in ex.source
    _check_conv(ex, x, w, padding=1)


@pytest.mark.parametrize(
    ("x", "w", "stride", "padding"),
    [
        ((2, 20, 9, 13), (19, 20, 3, 3), 1, 1),
        ((64, 256, 112, 112), (64, 256, 3, 3), 2, 1),  # the padded batch past 64M floats
        ((64, 64, 112, 112), (64, 64, 3, 3), 1, 1),  # just past it at stride 1
        ((2, 3, 224, 224), (64, 3, 7, 7), 2, 3),
        ((1, 8, 40, 40), (2048, 8, 3, 3), 1, 0),  # the tile past 16384 floats
        ((3, 5, 17, 31), (7, 5, 5, 3), 3, 2),
    ],
)
def test_schedule_direct_fits_agrees_with_the_template(
    x: tuple[int, ...], w: tuple[int, ...], stride: int, padding: int
) -> None:
    """The schedule's buffer arithmetic (`conv_columns.direct_fits`) is the direct template's own
    (`conv_direct.direct_fits`, which lays the buffers out), at each tier's register tile."""
    from vfuse.codegen.cpp.gemm import ConvSpec
    from vfuse.codegen.cpp.gemm.conv_direct import direct_fits as template_fits
    from vfuse.schedule.conv_columns import direct_fits

    graph = _conv(x, w, stride, padding)
    for t in (AVX2, VNNI):
        prog = build(_one(graph), t)
        c = _contraction_kernel(prog)
        spec = ConvSpec("k", *x, w[0], *w[2:], (stride,) * 2, (padding,) * 2, compact=bool(c.attrs.get("compact")))
        ours = direct_fits(c.attrs, x, w, c.out_shape, c.mr, c.nr, bool(c.attrs.get("compact")))
        assert ours == template_fits(spec, c.mr, c.nr, c.vector)


@pytest.mark.parametrize("images", [1, 3])
def test_conv_weight_packing_renders_as_decided(images: int) -> None:
    """Whether the implicit GEMM packs the weight once per call for all images is the schedule's
    (`ConvBlocks.weight_once`: with several images): flipped by hand, it renders so, same numbers."""
    x, w = (images, 24, 7, 9), (20, 24, 1, 1)  # pointwise: the implicit GEMM
    plan = _one(_conv(x, w))
    prog = build(plan, AVX2)
    c = _contraction_kernel(prog)
    assert c.conv_blocks is not None and c.conv_blocks.weight_once is (images > 1)
    flipped = dataclasses.replace(c.conv_blocks, weight_once=images == 1)
    prog = _edit_any(prog, lambda c: dataclasses.replace(c, conv_blocks=flipped))
    ex = _load(plan, prog)
    assert ("_pack_all(" in ex.source) is (images == 1)
    _check_conv(ex, x, w)
