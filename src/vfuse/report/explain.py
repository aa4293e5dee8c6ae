"""`explain(model_or_fn, *inputs, **options)`: what vfuse runs for a model, and why.

`explain` goes through the stages `vfuse.compile` goes through (export, lower, freeze, optimize,
plan, schedule, render: `compiler.py`) with the same options, and stops before g++: the report's
kernels are the schedule's Program, the kernels and torch calls a compiled graph runs.
`build_report(graph, plan, target, ...)` holds the logic and needs no torch capture, so it is
tested on hand-built graphs. Every figure about kernels comes from the planner's cost model; the
report never re-decides anything.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from vfuse.context import Context, Options
from vfuse.fusion.plan import Cost, FusionPlan
from vfuse.ir import Graph, Kind, Node, Op, opdef
from vfuse.report.model import FusionReport
from vfuse.report.modules import Source, exported_sources, node_sources
from vfuse.report.runs import Facts, UnfusedCosts, program_rows, reference_rows
from vfuse.schedule import Program
from vfuse.targets import Target, get_target

Scheduled = tuple[Program, str]  # the Program and its C++ source


def explain(
    model_or_fn: Callable[..., Any],
    *example_inputs: Any,
    target: str | None = None,
    profile: int = 0,
    profile_threads: int | None = None,
    dynamic_shapes: Any = None,
    **options: Any,
) -> FusionReport:
    """Capture `model_or_fn` on `example_inputs` and report the kernels vfuse.compile would run.

    `options` are every `vfuse.context.Options` field (freeze=True folds BatchNorm into the
    convolution as the compiled graph does; backend="interp" reports the reference executor;
    dump_dir writes each stage). Nothing is built with g++ or run, unless `profile` = N > 0: then
    the function is compiled as vfuse.compile does, each kernel timed over N runs on
    `example_inputs` (`CompiledGraph.profile`; on `profile_threads` threads when given, priced for
    that many cores) and the rows carry `measured_s`. `dynamic_shapes` (torch.export's) plans
    over symbolic sizes as the compiled program does; the report lists the symbols, what the
    program specialized on and the fusion decisions that change within the sizes' range.
    """
    if profile > 0:
        return profiled_report(model_or_fn, example_inputs, profile, profile_threads, target, options)
    # The pipeline imports torch capture; importing it here keeps `vfuse.report` light.
    from vfuse import compiler
    from vfuse.entry.aot import _freezable, export
    from vfuse.entry.dumps import graph_context
    from vfuse.frontend.symbols import sym_env

    ctx = graph_context(Options.from_env(target=target, **options), "explain0", "explain", example_inputs)
    program = export(model_or_fn, example_inputs, dynamic_shapes)
    frozen = _freezable(program) if ctx.options.freeze else {}
    env = sym_env(program.graph_module)
    graph = compiler.lower_fx(program.graph_module, ctx, env)
    graph = compiler.optimize(compiler.freeze(graph, frozen, ctx), ctx)
    hardware = compiler.target_of(ctx)
    plan = compiler.plan(graph, ctx, hardware)
    sources = node_sources(graph, exported_sources(program, model_or_fn))
    scheduled, note = _schedule(graph, plan, hardware, ctx)
    unfused = unfused_costs(graph, hardware)
    report = build_report(
        graph, plan, ctx.options.target, unfused, scheduled, sources=sources, hardware=hardware, note=note
    )
    if report.backend != "interp" and ctx.options.backend == "triton":
        report = dataclasses.replace(report, backend="triton")
    return report if env is None else with_symbols(report, graph, plan, env, hardware)


def with_symbols(report: FusionReport, graph: Graph, plan: FusionPlan, env: Any, hardware: Target) -> FusionReport:
    """The report of a graph planned over symbolic sizes: symbols, guards, decisions that flip
    (the planner's, then for C++ kernels the schedule's: those made per call, those that change)."""
    from vfuse.fusion.flips import flips, size_flips
    from vfuse.schedule import build
    from vfuse.schedule.choices import per_call_choices

    symbols = tuple(f"{s.name} = {env.hints[s]} here ({_range(env.ranges[s])})" for s in env.symbols)
    guards = tuple(str(g) for g in env.guards)
    lines = flips(graph, plan, env, hardware)
    if report.backend == "cpp" and not hardware.is_gpu:
        lines += per_call_choices(build(plan, hardware))
        lines += size_flips(env, lambda: _choices(build(plan, hardware)))
    return dataclasses.replace(report, symbols=symbols, guards=guards, flips=tuple(lines))


def _choices(program: Any) -> dict[str, str]:
    """The schedule's choices at the hints (the C++ GEMMs' and convs' cache blocks among them)."""
    from vfuse.schedule.choices import kernel_choices

    return kernel_choices(program)


def _range(r: Any) -> str:
    hi = str(int(r.upper)) if r.upper.is_Integer else "inf"  # torch's int_oo says is_finite
    return f"{int(r.lower)}..{hi}"


def profiled_report(
    model_or_fn: Callable[..., Any],
    example_inputs: tuple[Any, ...],
    reps: int,
    threads: int | None,
    target: str | None,
    options: Mapping[str, Any],
) -> FusionReport:
    """Compile as vfuse.compile does, profile, and report exactly the compiled graph's plan and
    Program (planning again could see a re-measured target and name other kernels)."""
    from vfuse.entry.aot import compile_aot
    from vfuse.targets.calibrate import at_threads

    compiled = compile_aot(model_or_fn, example_inputs, **({"target": target} if target else {}), **options)
    rows = compiled.profile(*example_inputs, reps=reps, threads=threads)
    g = compiled.compiled
    ex = g.executor
    hardware = get_target(g.plan.target, ex.cache_dir, isa=ex.program.isa)
    sources = node_sources(g.graph, exported_sources(compiled.program, model_or_fn))
    report = build_report(
        g.graph,
        g.plan,
        g.plan.target,
        unfused_costs(g.graph, hardware),
        (ex.program, ex.source),
        sources=sources,
        hardware=hardware,
    ).with_measured(rows)
    if threads is None:
        return report
    # The predictions the measurements are compared with: for `threads` cores, unfused too.
    fewer = unfused_costs(g.graph, at_threads(hardware, threads))
    return _repriced(report, rows, _unfused_time(g.graph.compute_nodes, fewer))


def _repriced(report: FusionReport, rows: Any, unfused_s: float | None) -> FusionReport:
    """The report with each kernel's predicted time as the profile priced it (for its threads),
    and the unfused time for as many threads."""
    predicted = {r.name: r.predicted_s for r in rows}
    kernels = tuple(dataclasses.replace(k, time_s=predicted[k.name]) for k in report.kernels)
    times = [k.time_s for k in kernels]
    total = None if None in times else sum(t for t in times if t is not None)
    return dataclasses.replace(report, kernels=kernels, time_fused_s=total, time_unfused_s=unfused_s)


def _schedule(graph: Graph, plan: FusionPlan, hardware: Target, ctx: Context) -> tuple[Scheduled | None, str]:
    """(program, C++ source) as compile_fx makes them, or None and why the reference executor runs."""
    from vfuse import compiler

    if ctx.options.backend == "interp":
        return None, "backend='interp': the reference executor runs every op through torch"
    try:
        if ctx.options.backend == "triton":  # as compile_fx: Triton kernels, contraction templates included
            program = compiler.schedule(plan, hardware, ctx, triton=True)
            return (program, compiler.render_triton(program, ctx).source), ""
        program = compiler.schedule(plan, hardware, ctx)
        return (program, compiler.render(program, ctx)), ""
    except Exception as e:
        # As compile_fx: a warning and the reference executor, or raise (strict, backend="cpp").
        return None, "native code failed: " + compiler.reference_after(e, graph, ctx).stats.native_error


def unfused_costs(graph: Graph, target: Target) -> dict[str, Cost] | None:
    """Each compute op's cost as a kernel of its own, from the planner's cost model: the baseline
    the fused time is compared with. None when the cost model cannot price some op."""
    from vfuse.fusion.cost import estimate

    try:
        return {n.name: estimate([n.name], graph, target) for n in graph.compute_nodes}
    except ValueError:
        return None


def build_report(
    graph: Graph,
    plan: FusionPlan,
    target: str,
    unfused: UnfusedCosts | None = None,
    scheduled: Scheduled | None = None,
    *,
    sources: Mapping[str, Source] | None = None,
    hardware: Target | None = None,
    note: str = "",
) -> FusionReport:
    """Describe what runs for `plan`: `scheduled` (the Program and its C++) when given; without
    it and without a `note` the plan is scheduled here; with a `note` (why native code does not
    run) every op runs on the reference executor. `unfused` gives each compute node's cost when
    run alone; without it (or with a gap in it) the unfused time is shown as unknown.
    """
    hardware = hardware or get_target(target)
    if scheduled is None and not note:
        from vfuse.schedule import build

        scheduled = (build(plan, hardware), "")
    program, source = scheduled if scheduled is not None else (None, "")
    facts = Facts(graph, plan, hardware, unfused, sources or {})
    kernels = program_rows(facts, program) if program is not None else reference_rows(facts, note)
    compute = graph.compute_nodes
    times = [k.time_s for k in kernels]
    return FusionReport(
        target=target,
        graph=graph,
        plan=plan,
        kernels=kernels,
        decisions=tuple(plan.decisions),
        num_ops=len(compute),
        bytes_unfused=sum(node_bytes(graph, n) for n in compute),
        bytes_fused=sum(k.bytes for k in kernels),
        bytes_lower_bound=bytes_lower_bound(graph),
        time_unfused_s=_unfused_time(compute, unfused),
        time_fused_s=None if None in times else sum(t for t in times if t is not None),
        fallbacks=fallback_counts(graph),
        backend="cpp" if program is not None else "interp",
        isa=hardware.isa_description,
        native_calls=len(program.segments) if program is not None else 0,
        sources=dict(sources or {}),
        source=source,
        note=note,
    )


def node_bytes(graph: Graph, node: Node) -> int:
    """DRAM traffic of `node` run as its own kernel, from its OpDef (reads inputs, writes output)."""
    in_types = tuple(graph[i].type for i in node.inputs)
    return opdef(node.op).bytes(in_types, node.type, node.attrs)  # type: ignore[arg-type]


def bytes_lower_bound(graph: Graph) -> int:
    """Graph inputs and constants that something reads, once, plus each graph output written once.

    An output that is itself an input or constant costs no write: it is returned as it is.
    """
    read = sum(n.type.nbytes for n in graph.nodes if n.kind is Kind.SOURCE and graph.users(n.name))
    written = sum(graph[o].type.nbytes for o in dict.fromkeys(graph.outputs) if graph[o].kind is not Kind.SOURCE)
    return read + written


def fallback_counts(graph: Graph) -> dict[str, int]:
    """Torch ops that run through the OPAQUE fallback, most frequent first."""
    names = Counter(_opaque_name(n) for n in graph.nodes if n.op is Op.OPAQUE)
    return dict(names.most_common())


def _opaque_name(node: Node) -> str:
    call = node.attrs.get("call")
    return str(call) if call is not None else node.op.value


def _unfused_time(compute: tuple[Node, ...], unfused: UnfusedCosts | None) -> float | None:
    # A partial table would understate the baseline, so it counts as unknown.
    if unfused is None or any(n.name not in unfused for n in compute):
        return None
    return sum(unfused[n.name].time_s for n in compute)
