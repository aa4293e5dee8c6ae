"""The vfuse pipeline as one readable list of stages.

    FX graph (ATen) --lower--> IR --optimize--> IR --plan--> FusionPlan --load--> CompiledGraph

Each stage is a function of its inputs and an explicit Context; with VFUSE_DUMP=dir every
stage's printed form lands in dir/<graph id>/ (01_fx.txt, 02_ir.txt, 03_optimized.txt, 04_plan.txt,
and the code generator's sources).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch

# The stages are imported with this module rather than inside the first compile: every compile
# needs all of them, and importing them (~50 modules, ~60 ms, mostly building dataclasses and
# op tables) would otherwise be billed to the first call of every process. Modules that the
# stages themselves load lazily (to break import cycles) are named here too.
from vfuse.codegen.cpp import contraction as _contraction  # noqa: F401  (render imports it lazily)
from vfuse.codegen.cpp import table as _table  # noqa: F401  (render imports it lazily)
from vfuse.codegen.cpp.toolchain import CompileError
from vfuse.context import Context
from vfuse.errors import VfuseCodegenError, VfuseError
from vfuse.frontend.lower import lower
from vfuse.fusion import format_plan, plan_fusion
from vfuse.ir import Graph, format_graph
from vfuse.passes import optimize as run_passes
from vfuse.passes.freeze import freeze_inputs
from vfuse.runtime.compiled import CompiledGraph, Executor, InterpExecutor
from vfuse.targets import Target, get_target
from vfuse.targets import cpu as _cpu  # noqa: F401  (get_target imports it lazily)

try:  # POSIX only (fcntl): without it every graph runs on the reference executor
    from vfuse.runtime.native import NativeExecutor

    _NATIVE_IMPORT_ERROR: ImportError | None = None
except ImportError as e:  # pragma: no cover
    NativeExecutor = None  # type: ignore[assignment,misc]
    _NATIVE_IMPORT_ERROR = e


def lower_fx(gm: torch.fx.GraphModule, ctx: Context) -> Graph:
    ctx.dump("01_fx.txt", str(gm.graph))
    graph = lower(gm, ctx)
    ctx.dump("02_ir.txt", format_graph(graph))
    return graph


def optimize(graph: Graph, ctx: Context) -> Graph:
    graph = run_passes(graph)
    ctx.dump("03_optimized.txt", format_graph(graph))
    return graph


def target_of(ctx: Context) -> Target:
    """ctx.options.target as a Target (`cpu`: this machine, from the on-disk cache)."""
    return get_target(ctx.options.target, ctx.options.cache_dir)


def plan(graph: Graph, ctx: Context, target: Target | None = None) -> Any:
    """The FusionPlan for `graph` on `target` (default: ctx.options.target)."""
    fusion_plan = plan_fusion(graph, target or target_of(ctx))
    ctx.dump("04_plan.txt", format_plan(fusion_plan))
    return fusion_plan


def make_executor(graph: Graph, fusion_plan: Any, ctx: Context, target: Target | None = None) -> Executor:
    """Generated C++ when asked for (or, with backend="auto", when it can be built), else the reference."""
    backend = ctx.options.backend
    if backend == "interp" or fusion_plan is None:
        return InterpExecutor(graph)
    if _NATIVE_IMPORT_ERROR is not None:
        if backend == "cpp":
            raise _NATIVE_IMPORT_ERROR
        return InterpExecutor(graph)
    try:
        return NativeExecutor(fusion_plan, target or target_of(ctx), ctx)
    except Exception as e:
        bug = codegen_bug(e)
        if bug and ctx.options.raise_codegen_errors:
            raise VfuseCodegenError(f"vfuse: native code generation for {ctx.graph_id} failed: {e}") from e
        if backend == "cpp" or ctx.options.strict:
            raise
        kind = "failed (a vfuse bug, please report it)" if bug else "is not available"
        warnings.warn(
            f"vfuse: native code for {ctx.graph_id} {kind}: {type(e).__name__}: {e}; using the reference executor",
            stacklevel=2,
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


def compile_fx(
    gm: torch.fx.GraphModule, ctx: Context, frozen: Mapping[int, torch.Tensor] | None = None
) -> CompiledGraph:
    """The whole pipeline for one ATen-level FX graph with concrete shapes.

    `frozen` maps input positions to parameter values compiled in as constants; the
    CompiledGraph then takes only the other inputs, in order.
    """
    start = time.perf_counter()
    graph = lower_fx(gm, ctx)
    graph = freeze(graph, frozen, ctx)
    graph = optimize(graph, ctx)
    target = target_of(ctx)  # read once: planning and code generation see the same machine
    fusion_plan = plan(graph, ctx, target)
    compiled = CompiledGraph(graph, fusion_plan, make_executor(graph, fusion_plan, ctx, target), ctx.graph_id)
    compiled.compile_s = time.perf_counter() - start
    return compiled
