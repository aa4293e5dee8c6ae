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
from vfuse.schedule.blocks import Blocking, CallBlocks
from vfuse.schedule.kernel import Accumulate, ContractionKernel, Kernel, Pass, Program, Reduction, Segment, Walk
from vfuse.schedule.strategy import lanes

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
STILL_DECIDING: dict[str, set[str]] = {
    "contraction.py": {"hint"},  # a conv's cache blocks at the hints; the report's GEMM blocks
}


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
    return src[src.index("const int64_t r = ") :]


@pytest.mark.parametrize("edit", ["none", "staged only", "longer runs"])
def test_transpose_prefetches_render_as_decided(edit: str) -> None:
    """Which accesses a tiled transpose prefetches and how far along each run are the schedule's
    (`TransposeTiles.prefetches`): a Program edited by hand renders exactly those, and still
    computes eager's numbers (80 x 144 fp32: rows on whole lines, three prefetched accesses)."""
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
    prog = _edit(prog, lambda k: dataclasses.replace(k, transpose=dataclasses.replace(t, prefetches=chosen)))
    ex = _load(plan, prog)
    body = _transpose_body(ex)
    assert body.count("__builtin_prefetch(") == len(chosen)
    for pf in chosen:
        assert f"l < {pf.run}; l += 16" in body
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
