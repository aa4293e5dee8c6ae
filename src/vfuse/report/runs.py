"""The kernels that run, read off the schedule's Program: one row per generated kernel and per
torch step, each with the IR nodes it computes and the cost model's figures for exactly them.

A kernel does not list its IR nodes; it stores some values and loads others, and computes
everything in between (`schedule/lower.py` lowers by demand from the stores). So its nodes are
the closure from its stores back to its loads. A group that runs as one kernel keeps the
planner's own cost; a kernel split off a group (a GEMM's separate epilogue pass, one pointwise
nest per output shape) is priced by the same cost model on its own nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from vfuse.fusion.cost import estimate
from vfuse.fusion.plan import Cost, FusionPlan, Group
from vfuse.ir import Graph, Kind, Op, opdef
from vfuse.report.modules import Source
from vfuse.report.patterns import pattern_of
from vfuse.report.rows import KernelRow, RunKind
from vfuse.report.units import op_label
from vfuse.schedule.contents import computed, stored
from vfuse.schedule.kernel import AnyKernel, ContractionKernel, Program, Segment, TorchStep
from vfuse.targets import Target

UnfusedCosts = Mapping[str, Cost]


@dataclass(frozen=True)
class Facts:
    """What every row needs to know about the graph, besides the kernel itself."""

    graph: Graph
    plan: FusionPlan
    target: Target
    unfused: UnfusedCosts | None
    sources: Mapping[str, Source]


def program_rows(facts: Facts, program: Program) -> tuple[KernelRow, ...]:
    """One row per kernel and torch step of `program`, in run order."""
    items: list[tuple[AnyKernel | TorchStep, str]] = []
    for step in program.steps:
        if isinstance(step, Segment):
            items += [(k, step.name) for k in step.kernels]
        else:
            items.append((step, ""))
    per_group = Counter(item.group for item, _ in items)
    groups = {g.id: g for g in facts.plan.groups}
    rows = []
    for i, (item, segment) in enumerate(items):
        group = groups[item.group]
        whole = per_group[item.group] == 1
        if isinstance(item, TorchStep):
            rows.append(_torch_row(facts, i, item.nodes, group, whole, item.reason))
        else:
            rows.append(_kernel_row(facts, i, item, segment, group, whole))
    return tuple(rows)


def reference_rows(facts: Facts, note: str) -> tuple[KernelRow, ...]:
    """The reference executor: every compute op through torch (get_item only selects)."""
    compute = [n for n in facts.graph.compute_nodes if n.op is not Op.GET_ITEM]
    group = {n: g for g in facts.plan.groups for n in g.nodes}
    return tuple(
        _torch_row(facts, i, (n.name,), group[n.name], False, note) if n.name in group else _orphan(facts, i, n.name)
        for i, n in enumerate(compute)
    )


def _orphan(facts: Facts, i: int, node: str) -> KernelRow:
    """A node no planner group holds (a hand-made plan): it still runs, alone."""
    group = Group(-1, (node,), facts.graph[node].kind, "", (), (), Cost(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0))
    return _torch_row(facts, i, (node,), group, False, "reference executor")


def _kernel_row(facts: Facts, i: int, k: AnyKernel, segment: str, group: Group, whole: bool) -> KernelRow:
    graph = facts.graph
    nodes = computed(graph, k)
    writes = stored(k)
    reads = tuple(v for v in k.buffers if v not in writes)
    cost = group.cost if whole else _estimate(facts, nodes, writes)
    runs = RunKind.TEMPLATE if isinstance(k, ContractionKernel) else RunKind.NATIVE
    anchor = k.node if isinstance(k, ContractionKernel) else _anchor(graph, nodes)
    return _row(facts, i, k.name, runs, segment, group, nodes, cost, anchor, reads, writes)


def _torch_row(facts: Facts, i: int, nodes: Sequence[str], group: Group, whole: bool, note: str) -> KernelRow:
    graph = facts.graph
    inside = set(nodes)
    reads = tuple(dict.fromkeys(v for n in nodes for v in graph[n].inputs if v not in inside))
    writes = tuple(n for n in nodes if graph.is_output(n) or any(u not in inside for u in graph.users(n)))
    cost = group.cost if whole else _sum_unfused(facts, nodes)
    row = _row(facts, i, f"torch{i}", RunKind.TORCH, "", group, tuple(nodes), cost, nodes[0], reads, writes)
    return replace(row, note=note)


def _row(
    facts: Facts,
    i: int,
    name: str,
    runs: RunKind,
    segment: str,
    group: Group,
    nodes: tuple[str, ...],
    cost: Cost | None,
    anchor: str,
    reads: tuple[str, ...],
    writes: tuple[str, ...],
) -> KernelRow:
    graph, sources = facts.graph, facts.sources
    src = sources.get(anchor)
    modules = _modules(graph, nodes, sources)
    c = cost or Cost(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return KernelRow(
        id=i,
        name=name,
        runs=runs,
        group=group.id,
        segment=segment,
        nodes=nodes,
        ops=tuple(op_label(graph[n]) for n in nodes),
        kind=group.kind.name.lower(),
        label=group.label,
        pattern=_horizontal(group, runs) + pattern_of(graph, nodes, sources, torch=runs is RunKind.TORCH),
        module=src.label if src is not None else "",
        modules=modules,
        time_s=cost.time_s if cost is not None else None,
        flops=c.flops,
        bytes=c.bytes,
        bound=c.bound if cost is not None else "unknown",
        pressure=c.pressure,
        parallelism=c.parallelism,
        inputs=reads,
        outputs=writes,
    )


def _modules(graph: Graph, nodes: Sequence[str], sources: Mapping[str, Source]) -> tuple[str, ...]:
    """The modules a kernel's work came from: of its real ops (a view feeding the next layer is
    that layer's), never of nodes without inputs (CSE keeps one of equal constants, first origin)."""
    known = [n for n in nodes if n in sources and graph[n].inputs]
    real = [n for n in known if not opdef(graph[n].op).layout_only] or known
    return tuple(dict.fromkeys(sources[n].label for n in real))


def _anchor(graph: Graph, nodes: Sequence[str]) -> str:
    """The node that names a kernel's module: its first reduction, else its first real op."""
    ns = [graph[n] for n in nodes]
    first = next((n for n in ns if n.kind is Kind.REDUCE), None) or next(
        (n for n in ns if not opdef(n.op).layout_only), None
    )
    return first.name if first is not None else (nodes[0] if nodes else "")


def _estimate(facts: Facts, nodes: Sequence[str], writes: Sequence[str]) -> Cost | None:
    try:
        return estimate(nodes, facts.graph, facts.target, writes)
    except ValueError:
        return None


def _sum_unfused(facts: Facts, nodes: Sequence[str]) -> Cost | None:
    """Torch runs each node as its own kernel: the sum of their unfused costs."""
    if facts.unfused is None or any(n not in facts.unfused for n in nodes):
        return None
    return Cost.sum_of([facts.unfused[n] for n in nodes])


def _horizontal(group: Group, runs: RunKind) -> str:
    """The word before the pattern of a kernel running independent nests (`fusion/horizontal.py`)."""
    return "horizontal " if group.label == "horizontal" and runs is not RunKind.TORCH else ""
