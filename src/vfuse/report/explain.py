"""`explain(model, *inputs)`: capture, plan, and describe what vfuse would fuse and why.

`build_report(graph, plan, target)` holds all the logic and needs no torch capture, so it is
tested on hand-built graphs. It only reads the graph, the plan and its decision log: every
figure about kernels comes from the planner's own Cost records, never from a second opinion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from vfuse.context import Context, Options
from vfuse.fusion.plan import Cost, FusionPlan, Group
from vfuse.ir import Graph, Kind, Node, Op, opdef
from vfuse.report.model import FusionReport, KernelRow

# Per-node cost of running an op alone, as the planner's cost model predicts it.
UnfusedCosts = Mapping[str, Cost]


def explain(model_or_fn: Callable[..., Any], *example_inputs: Any, target: str = "cpu", **options: Any) -> FusionReport:
    """Capture `model_or_fn` on `example_inputs`, plan fusion for `target`, and report on it.

    `options` are `vfuse.context.Options` fields (e.g. strict=True). Nothing is compiled or run.
    """
    # The pipeline imports torch capture; importing it here keeps `vfuse.report` light.
    from vfuse.compiler import plan as plan_graph
    from vfuse.entry.aot import to_ir

    ctx = Context(options=Options.from_env(target=target, **options))
    graph = to_ir(model_or_fn, tuple(example_inputs), ctx)
    plan = plan_graph(graph, ctx)
    return build_report(graph, plan, target, unfused_costs(graph, ctx))


def unfused_costs(graph: Graph, ctx: Context) -> dict[str, Cost] | None:
    """Each compute op's cost as a kernel of its own, from the planner's cost model: the baseline
    the fused time is compared with. None when the cost model cannot price some op."""
    from vfuse.fusion.cost import estimate
    from vfuse.targets import get_target

    target = get_target(ctx.options.target, ctx.options.cache_dir)
    try:
        return {n.name: estimate([n.name], graph, target) for n in graph.compute_nodes}
    except ValueError:
        return None


def build_report(graph: Graph, plan: FusionPlan, target: str, unfused: UnfusedCosts | None = None) -> FusionReport:
    """Describe `plan` for `graph`. `unfused` gives each compute node's cost when run alone;
    without it (or with a gap in it) the unfused time is shown as unknown rather than guessed.
    """
    compute = graph.compute_nodes
    return FusionReport(
        target=target,
        graph=graph,
        plan=plan,
        groups=tuple(_kernel_row(graph, g) for g in plan.groups),
        decisions=tuple(plan.decisions),
        num_ops=len(compute),
        bytes_unfused=sum(node_bytes(graph, n) for n in compute),
        bytes_fused=sum(g.cost.bytes for g in plan.groups),
        bytes_lower_bound=bytes_lower_bound(graph),
        time_unfused_s=_unfused_time(compute, unfused),
        time_fused_s=sum(g.cost.time_s for g in plan.groups),
        fallbacks=fallback_counts(graph),
    )


def _kernel_row(graph: Graph, group: Group) -> KernelRow:
    c = group.cost
    return KernelRow(
        id=group.id,
        nodes=tuple(group.nodes),
        ops=tuple(graph[n].op.value for n in group.nodes),
        kind=group.kind.name.lower(),
        label=group.label,
        time_s=c.time_s,
        flops=c.flops,
        bytes=c.bytes,
        bound=c.bound,
        pressure=c.pressure,
        parallelism=c.parallelism,
        inputs=tuple(group.inputs),
        outputs=tuple(group.outputs),
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
