"""The vfuse pipeline as one readable list of stages (`compile_fx`).

    FX graph (ATen) --lower--> IR --freeze--> IR --optimize--> IR --plan--> FusionPlan
      --schedule--> Program --render--> C++ --build--> library --load--> NativeExecutor
                    (backend="triton": --render--> Triton module --load--> TritonExecutor)

Each stage is a function of its inputs and an explicit Context; with VFUSE_DUMP=dir every
stage's printed form lands in dir/<graph id>/ (01_fx.txt, 02_ir.txt, 03_optimized.txt,
04_plan.txt, 05_program.txt, 06_kernels.cpp). With `verify` (VFUSE_VERIFY=1) the IR is checked
after lowering and after every optimization pass. A graph whose native code cannot be built
runs on the reference executor with a warning (or raises: `strict`, `raise_codegen_errors`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.util
import time
import warnings
from collections.abc import Collection, Mapping
from typing import Any

import torch

# The stages are imported with this module rather than inside the first compile: every compile
# needs all of them, and importing them (~50 modules, ~60 ms, mostly building dataclasses and
# op tables) would otherwise be billed to the first call of every process.
from vfuse.codegen.cpp import render as render_cpp
from vfuse.codegen.cpp.toolchain import CompileError, find_toolchain, load_library
from vfuse.codegen.triton import TritonProgram, TritonUnsupported
from vfuse.codegen.triton import render as render_triton_source
from vfuse.codegen.triton.offline import measure
from vfuse.context import Context
from vfuse.errors import VfuseCodegenError, VfuseError
from vfuse.frontend.lower import lower
from vfuse.fusion import FusionPlan, format_plan, plan_fusion
from vfuse.fusion.onchip import OnChip, fit_on_chip
from vfuse.ir import Graph, IRError, Op, format_graph, verify
from vfuse.ir.sym import SymEnv, hint, is_sym
from vfuse.passes import PIPELINE, fuse_attention
from vfuse.passes.freeze import freeze_inputs
from vfuse.runtime.arena_outputs import ArenaOutputExecutor
from vfuse.runtime.compiled import CompiledGraph, ExecStats, Executor, InterpExecutor
from vfuse.runtime.native import NativeExecutor
from vfuse.runtime.steps import fallback_counts, torch_nodes
from vfuse.runtime.symbolic import NativeSizes, Substitution, SymbolicExecutor
from vfuse.runtime.triton import TritonExecutor, Tuning
from vfuse.schedule import Kernel, Program
from vfuse.schedule import build as build_schedule
from vfuse.schedule.donate import donate_outputs, outputs_in_arena
from vfuse.schedule.gpu import candidates as gpu_candidates
from vfuse.schedule.inplace import write_in_place
from vfuse.schedule.kernel import Const, ContractionKernel, Walk
from vfuse.schedule.printer import format_program
from vfuse.targets import Target, get_target


def compile_fx(
    gm: torch.fx.GraphModule,
    ctx: Context,
    frozen: Mapping[int, torch.Tensor] | None = None,
    symbols: SymEnv | None = None,
    replaces: Mapping[int, int] | None = None,
    donated: Collection[int] = (),
) -> CompiledGraph:
    """The whole pipeline for one ATen-level FX graph.

    `frozen` maps input positions to parameter values compiled in as constants; the
    CompiledGraph then takes only the other inputs, in order. With `symbols` (the graph's
    symbolic sizes, `frontend.symbols.sym_env`) one program serves every size its guards admit.
    `replaces` maps output positions to the input positions (after freezing) whose new values
    they are: a native program writes those it safely can into the inputs (`schedule/inplace.py`),
    whose positions `CompiledGraph.in_place` lists; the graph no longer returns them.
    `donated`: input positions whose bytes the graph may reuse once it has read them (a training
    backward's donated saved activations): outputs are stored there (`schedule/donate.py`).
    """
    start = time.perf_counter()
    target = target_of(ctx)  # read once: lowering, planning and code generation see the same machine
    graph = lower_fx(gm, ctx, symbols, target)
    graph = freeze(graph, frozen, ctx)
    graph = optimize(graph, ctx)
    fusion_plan = plan(graph, ctx, target)
    executor: Executor
    in_place: tuple[int, ...] = ()
    if symbols is not None:
        executor = compile_symbolic(graph, fusion_plan, target, ctx, symbols)
    elif ctx.options.backend == "interp":
        executor = InterpExecutor(graph)
    elif ctx.options.backend == "triton":
        program = schedule(fusion_plan, target, ctx, triton=True)
        executor = load_triton(fusion_plan, program, render_triton(program, ctx), ctx, target)
    else:
        try:
            program = schedule(fusion_plan, target, ctx)
            program, native_plan = write_inputs(program, fusion_plan, replaces or {}, ctx)
            if donated:
                by_index = {n.attrs["index"]: n.name for n in native_plan.graph.inputs}
                donors = [by_index[i] for i in donated if i in by_index]
                program = outputs_in_arena(donate_outputs(program, native_plan.graph, donors), native_plan.graph)
            source = render(program, ctx)
            library = build(source, program, ctx)
            executor = load(native_plan, program, source, library, ctx)
            in_place = tuple(i for i, o in enumerate(graph.outputs) if o in dict(program.in_place))
            graph, fusion_plan = native_plan.graph, native_plan
        except Exception as e:
            executor = reference_after(e, graph, ctx)
    compiled = CompiledGraph(graph, fusion_plan, executor, ctx.graph_id)
    compiled.in_place = in_place
    compiled.compile_s = time.perf_counter() - start
    return compiled


def lower_fx(
    gm: torch.fx.GraphModule, ctx: Context, symbols: SymEnv | None = None, target: Target | None = None
) -> Graph:
    ctx.dump("01_fx.txt", str(gm.graph))
    graph = lower(gm, ctx, symbols, target)
    if ctx.options.verify:
        _verify(graph, "after lowering")
    ctx.dump("02_ir.txt", format_graph(graph))
    return graph


def optimize(graph: Graph, ctx: Context) -> Graph:
    """The optimization passes in order (`passes.PIPELINE`), each checked in verify mode; for
    backend="triton", attention with dropout on P becomes SDPA too (its template draws the mask)."""
    passes = [*PIPELINE] + (
        [("fuse_attention(dropout)", _attention_dropout)] if ctx.options.backend == "triton" else []
    )
    for name, run in passes:
        graph = run(graph)
        if ctx.options.verify:
            _verify(graph, f"after pass {name}")
    ctx.dump("03_optimized.txt", format_graph(graph))
    return graph


def _attention_dropout(graph: Graph) -> Graph:
    return fuse_attention(graph, dropout=True)


def _verify(graph: Graph, where: str) -> None:
    try:
        verify(graph)
    except IRError as e:
        raise IRError(f"{where}: {e}") from e


def target_of(ctx: Context) -> Target:
    """ctx.options.target as a Target (`cpu`: this machine, from the on-disk cache, at the
    instruction-set tier ctx.options.isa)."""
    return get_target(ctx.options.target, ctx.options.cache_dir, isa=ctx.options.isa)


def plan(graph: Graph, ctx: Context, target: Target | None = None) -> FusionPlan:
    """The FusionPlan for `graph` on `target` (default: ctx.options.target); for a GPU target,
    with each group's kernel compiled offline and split where it spills (`fusion/onchip.py`)."""
    target = target or target_of(ctx)
    if measures_on_chip(ctx, target):
        fusion_plan = fit_on_chip(target, TritonProbe(target, ctx), lambda b: plan_fusion(graph, target, b))
    else:
        fusion_plan = plan_fusion(graph, target)
    ctx.dump("04_plan.txt", format_plan(fusion_plan))
    return fusion_plan


def measures_on_chip(ctx: Context, target: Target) -> bool:
    """Whether planning measures kernels offline: a GPU target, a backend that compiles, triton."""
    return target.is_gpu and ctx.options.backend != "interp" and importlib.util.find_spec("triton") is not None


class TritonProbe:
    """`fusion.onchip.OnChipProbe`: a plan scheduled and rendered as Triton kernels, each compiled
    offline for the SM (figures cached in the kernel cache); a group's figures are the largest
    of its kernels (its index checks included). A plan that cannot be rendered is not measured."""

    def __init__(self, target: Target, ctx: Context) -> None:
        self.target, self.ctx = target, ctx

    def __call__(self, fusion_plan: FusionPlan, sm: int) -> dict[int, OnChip]:
        try:
            program = build_schedule(fusion_plan, self.target, triton=True)
            rendered = render_triton_source(program)
        except Exception as e:
            # A vfuse bug raises where these kernels are the ones that run (backend="triton");
            # a C++ build planned for a GPU target keeps going, unmeasured.
            triton = self.ctx.options.backend == "triton"
            bug = codegen_bug(e) and not isinstance(e, TritonUnsupported)
            if triton and bug and self.ctx.options.raise_codegen_errors:
                raise
            return {}
        try:
            figures = measure(rendered, self.ctx.options.cache_dir, sm)
        except Exception:  # the offline toolchain (ptxas, this Triton's API): no figures, as without triton
            return {}
        group = {k.name: k.group for seg in program.segments for k in seg.kernels}
        out: dict[int, OnChip] = {}
        for fn, r in figures.items():
            g = group[fn.split("_check")[0]]
            out[g] = OnChip(sm, r.registers, r.spill_bytes, r.shared_bytes).worst(out.get(g))
        return out


def schedule(
    fusion_plan: FusionPlan, target: Target, ctx: Context, templates: bool = True, triton: bool = False
) -> Program:
    """Loops, vectorization, kernels, segments and the arena: every decision a renderer acts on
    (`templates=False`: contractions through torch, for a backend without their templates;
    `triton`: for the Triton renderer, whose templates take GPU tiles)."""
    program = build_schedule(fusion_plan, target, templates, triton)
    ctx.dump("05_program.txt", format_program(program))
    return program


def write_inputs(
    program: Program, fusion_plan: FusionPlan, replaces: Mapping[int, int], ctx: Context
) -> tuple[Program, FusionPlan]:
    """The outputs in `replaces` (position -> input position) stored into their inputs where
    `schedule/inplace.py` finds it safe; the plan's graph then returns only the others."""
    graph = fusion_plan.graph
    by_index = {n.attrs["index"]: n.name for n in graph.inputs}
    pairs = {graph.outputs[o]: by_index[i] for o, i in replaces.items() if i in by_index}
    program = write_in_place(program, graph, pairs)
    if not program.in_place:
        return program, fusion_plan
    ctx.dump("05_program.txt", format_program(program))
    done = dict(program.in_place)
    kept = Graph(graph.nodes, tuple(o for o in graph.outputs if o not in done))
    return program, dataclasses.replace(fusion_plan, graph=kept)


def render(program: Program, ctx: Context) -> str:
    """The Program as one C++ translation unit."""
    source = render_cpp(program)
    ctx.dump("06_kernels.cpp", source)
    return source


def render_triton(program: Program, ctx: Context) -> TritonProgram:
    """The Program (scheduled for a GPU target) as one Triton module."""
    rendered = render_triton_source(program)
    ctx.dump("06_kernels.py", rendered.source)
    return rendered


def load_triton(
    fusion_plan: FusionPlan, program: Program, rendered: TritonProgram, ctx: Context, target: Target | None = None
) -> TritonExecutor:
    """The executor of the Triton module (on CPU tensors: Triton's interpreter); needs the `gpu`
    extra. With `target`, CUDA calls autotune the contraction templates' tiles for its preset."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise VfuseError(f"vfuse: backend='triton' needs triton (pip install 'vfuse[gpu]'): {e}") from e
    o = ctx.options
    tune = target is not None and o.autotune
    tuning = Tuning(target.name, functools.partial(gpu_candidates, target=target)) if tune else None
    return TritonExecutor(fusion_plan, program, rendered, o.cache_dir, o.static_outputs, o.cuda_graphs, tuning=tuning)


def build(source: str, program: Program, ctx: Context) -> ctypes.CDLL | None:
    """The compiled, loaded library: g++ through the kernel cache (none without native segments),
    with the flags of the instruction-set tier the program was scheduled for."""
    if not program.segments:
        return None
    return load_library(source, ctx.options.cache_dir, find_toolchain(isa=program.isa))


def load(
    fusion_plan: FusionPlan, program: Program, source: str, library: ctypes.CDLL | None, ctx: Context
) -> NativeExecutor:
    """The executor of the built program: entry points bound, arena allocated on its first call."""
    opts = ctx.options
    cls = ArenaOutputExecutor if program.arena_outputs else NativeExecutor
    return cls(fusion_plan, program, source, library, static_outputs=opts.static_outputs, cache_dir=opts.cache_dir)


def compile_symbolic(graph: Graph, fusion_plan: FusionPlan, target: Target, ctx: Context, env: SymEnv) -> Executor:
    """A program over symbolic sizes: scheduled, rendered and built once, guarded by the guards
    the compilation took, run per size by `SymbolicExecutor`. Anything it cannot do raises (the
    caller then compiles per shape instead)."""
    if ctx.options.backend not in ("cpp", "auto", "interp"):
        raise VfuseError(f"backend {ctx.options.backend!r} compiles per shape")
    if ctx.options.backend == "interp":
        env.frozen = True
        whole = Substitution(graph, symbols=env.symbols)
        return SymbolicExecutor(graph, env, lambda v: InterpExecutor(whole(v)), InterpExecutor(graph).stats)
    try:
        program = schedule(fusion_plan, target, ctx)
        unsized = [k.name for k in program.kernels if not takes_sizes(k)]
        if unsized:
            raise VfuseError(f"kernels {unsized} need constant sizes: compiled per shape")
        if any(isinstance(k, ContractionKernel) and k.prepacked_b for k in program.kernels):
            # The persistent region of packed operands sits past the intermediates: it would move
            # with the sizes, and the executors of all sizes share one arena.
            raise VfuseError("operands packed once need a fixed arena: compiled per shape")
        source = render(program, ctx)
        library = build(source, program, ctx)
    except Exception as e:
        # The caller compiles per shape instead, unless this is a vfuse bug the tests must see.
        if codegen_bug(e) and ctx.options.raise_codegen_errors:
            raise VfuseCodegenError(f"vfuse: symbolic code generation for {ctx.graph_id} failed: {e}") from e
        raise
    return symbolic_executor(graph, fusion_plan, program, source, library, ctx, env)


def from_symbolic_program(
    graph: Graph, fusion_plan: FusionPlan, program: Program, source: str, ctx: Context, env: SymEnv
) -> CompiledGraph:
    """The CompiledGraph of a program an earlier process compiled over these symbols
    (entry/warm_program.py): no lowering, planning or scheduling; its library from the kernel
    cache. `env` holds the program's guards already."""
    start = time.perf_counter()
    executor = symbolic_executor(graph, fusion_plan, program, source, build(source, program, ctx), ctx, env)
    compiled = CompiledGraph(graph, fusion_plan, executor, ctx.graph_id)
    compiled.compile_s = time.perf_counter() - start
    return compiled


def from_static_program(
    graph: Graph, fusion_plan: FusionPlan, program: Program, source: str, ctx: Context
) -> CompiledGraph:
    """The CompiledGraph of a fixed-shape program an earlier process compiled (entry/warm_program.py):
    no lowering, planning or scheduling; its library from the kernel cache."""
    start = time.perf_counter()
    executor = load(fusion_plan, program, source, build(source, program, ctx), ctx)
    compiled = CompiledGraph(graph, fusion_plan, executor, ctx.graph_id)
    compiled.compile_s = time.perf_counter() - start
    return compiled


def symbolic_executor(
    graph: Graph,
    fusion_plan: FusionPlan,
    program: Program,
    source: str,
    library: ctypes.CDLL | None,
    ctx: Context,
    env: SymEnv,
) -> SymbolicExecutor:
    """The executor of a built symbolic program, run per size (its guards are final now)."""
    env.frozen = True  # every decision is taken: guards are final
    ctx.dump("05_guards.txt", "\n".join(map(str, env.guards)) or "(no guards: every size)")
    opts = ctx.options
    # What the executor of a size reads: buffers and arena (the kernels read the sizes themselves).
    make = NativeSizes(
        program, fusion_plan, env.symbols, source=source, library=library,
        static_outputs=opts.static_outputs, cache_dir=opts.cache_dir,
    )  # fmt: skip
    stats = ExecStats(
        "cpp",
        kernels=len(program.kernels),
        native_calls=len(program.segments),
        torch_calls=torch_nodes(program),
        arena_bytes=hint(program.memory.size),
        fallbacks=fallback_counts(program, fusion_plan),
    )
    return SymbolicExecutor(graph, env, make, stats, program, source)


# Walks whose renderers read symbolic sizes at run time (`vf_s0`); the contraction templates,
# tables, transposes and horizontal kernels are written for constant sizes.
SIZED_WALKS = (Walk.SINGLE_ROW, Walk.ROWS, Walk.ROW_GROUPS, Walk.TILED_COLUMNS, Walk.TILED_TRANSPOSE)


def takes_sizes(k: Any) -> bool:
    """Whether kernel `k` can run at sizes known only at run time: a sized walk, the fp32 GEMM
    template (its driver blocks at run time), or no symbolic size anywhere in it (its repr
    names every field, SymSizes included)."""
    if isinstance(k, Kernel) and k.walk is Walk.LOOKUP_TABLE:
        # The table is computed once per process (a static): no size may enter its entries.
        consts = [s for p in k.passes for s in (*p.before, *p.body) if isinstance(s, Const)]
        return not any(is_sym(s.value) for s in consts)
    if isinstance(k, Kernel):
        return k.walk in SIZED_WALKS or "SymSize(" not in repr(k)
    if isinstance(k, ContractionKernel) and k.op is Op.MATMUL and k.int8 is None:
        return True
    if isinstance(k, ContractionKernel) and k.op is Op.CONV2D:
        if k.attrs.get("folded"):
            return True  # the weight-gradient template reads every size at run time (conv_wgrad.py)
        if "SymSize(" not in repr((k.shapes[1], k.out_shape[1:], k.epilogue)):
            return True  # a batch size only
        # Symbolic planes: the implicit GEMM (run-time blocks, a gather reading the sizes:
        # schedule/conv_blocks.py), not the direct path's copy.
        blocks, channels = k.conv_blocks, (k.shapes[1], k.shapes[0][1], k.out_shape[1])
        direct = blocks is None or blocks.direct
        return "SymSize(" not in repr(channels) and not direct
    if isinstance(k, ContractionKernel) and k.op is Op.SCATTER_ADD:
        return True  # its sizes are the template's arguments (codegen/cpp/scatter.py)
    if isinstance(k, ContractionKernel) and k.op in (Op.SDPA, Op.SDPA_LSE, Op.SDPA_BACKWARD):
        # Batch, heads and lengths are the flash-attention template's run-time arguments; its
        # epilogue is inlined into the template, so it must not read a size.
        return "SymSize(" not in repr(k.epilogue)
    return "SymSize(" not in repr(k)


def native_executor(fusion_plan: FusionPlan, target: Target, ctx: Context) -> NativeExecutor:
    """schedule -> render -> build -> load, for callers that plan by hand (tests, tools)."""
    program = schedule(fusion_plan, target, ctx)
    source = render(program, ctx)
    return load(fusion_plan, program, source, build(source, program, ctx), ctx)


def reference_after(e: Exception, graph: Graph, ctx: Context) -> InterpExecutor:
    """The reference executor for a graph whose native code could not be built, with a warning;
    or raise: a vfuse bug with `raise_codegen_errors`, anything with `strict` or backend="cpp"."""
    bug = codegen_bug(e)
    if bug and ctx.options.raise_codegen_errors:
        raise VfuseCodegenError(f"vfuse: native code generation for {ctx.graph_id} failed: {e}") from e
    if ctx.options.backend == "cpp" or ctx.options.strict:
        raise e
    kind = "failed (a vfuse bug, please report it)" if bug else "is not available"
    warnings.warn(
        f"vfuse: native code for {ctx.graph_id} {kind}: {type(e).__name__}: {e}; using the reference executor",
        stacklevel=3,
    )
    fallback = InterpExecutor(graph)
    fallback.stats.native_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return fallback


def codegen_bug(e: Exception) -> bool:
    """Whether a failure to build native code is vfuse's own (C++ the compiler rejects, an
    exception while scheduling or rendering) rather than the machine's (no compiler, an
    unusable cache directory: errors raised on purpose, or the OS refusing a file)."""
    return isinstance(e, CompileError) or not isinstance(e, VfuseError | OSError)


def freeze(graph: Graph, values: Mapping[int, torch.Tensor] | None, ctx: Context) -> Graph:
    """Inputs named in `values` (parameters, when ctx.options.freeze) become constants."""
    return freeze_inputs(graph, values) if values else graph
