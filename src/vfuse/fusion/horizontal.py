"""Horizontal fusion: independent pointwise kernels of one dtype become one kernel.

The vertical planner fuses producers into consumers; it leaves independent kernels apart,
however small: an optimizer step is one small pointwise kernel per parameter (and one per
step counter). This pass runs after it on CPU targets and merges, per dtype, the pointwise
groups whose outputs all leave the graph or are scalars (parameter updates, their state,
step counters) into one group labelled "horizontal". The schedule runs it as one generated
function whose parts (one loop nest per output shape) share one parallel region
(`schedule/horizontal.py`), so many small updates spread over the threads instead of each
running alone on one.

Legality: a member may read another member's output only when it is a scalar (numel 1): the
schedule recomputes it once per part, outside the loops (a bias correction from the step).
A merge never makes a cycle: a group joins a batch only when none of its producers outside
the batch depends on a member.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from vfuse.fusion.plan import Cost, Decision, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.ir import DType, Graph, Kind

LABEL = "horizontal"
JOINABLE = ("pointwise",)
# IR nodes per horizontal kernel; a batch that reaches it starts another. g++'s time grows faster
# than a function's size: 600 bf16 max-pools (13k nodes) compiled in 110 s as one kernel, 45 s at
# 4096, 36 s at 1024, 30 s at 256 (docs/perf-log.md); each kernel more costs one parallel region a call.
MAX_NODES = 1024


def horizontal(plan: FusionPlan, launch_s: float) -> FusionPlan:
    """`plan` with its independent pointwise groups merged per dtype (see the module doc);
    `launch_s` is the target's per-kernel overhead, saved once per merged group."""
    graph, groups = plan.graph, plan.groups
    producers = _producers(groups)
    ancestors: list[int] = []  # bitset of transitive producer indices, per group index
    for i in range(len(groups)):
        acc = 0
        for p in producers[i]:
            acc |= ancestors[p] | (1 << p)
        ancestors.append(acc)
    batches: dict[tuple[DType, int], list[int]] = {}
    size: dict[tuple[DType, int], int] = {}
    filled: dict[DType, int] = {}  # per dtype, how many batches reached MAX_NODES
    for i, g in enumerate(groups):
        dtype = _joinable(g, graph)
        if dtype is None:
            continue
        key = (dtype, filled.get(dtype, 0))
        batch = batches.setdefault(key, [])
        mask = sum(1 << m for m in batch)
        if _can_join(i, groups, producers, ancestors, mask, graph):
            batch.append(i)
            size[key] = size.get(key, 0) + len(g.nodes)
            if size[key] >= MAX_NODES:
                filled[dtype] = key[1] + 1
    merged = {k: b for k, b in batches.items() if len(b) > 1}
    if not merged:
        return plan
    decisions = [*plan.decisions, *(_decision(groups, b, k[0]) for k, b in merged.items())]
    new = _regroup(graph, groups, merged, launch_s)
    return dataclasses.replace(plan, groups=new, decisions=tuple(decisions))


def _producers(groups: Sequence[Group]) -> list[list[int]]:
    made = {o: i for i, g in enumerate(groups) for o in g.outputs}
    return [sorted({made[v] for v in g.inputs if v in made and made[v] != i}) for i, g in enumerate(groups)]


def _joinable(g: Group, graph: Graph) -> DType | None:
    """The dtype of a pointwise group whose outputs leave the graph or are scalars, else None."""
    if g.label not in JOINABLE or g.kind > Kind.INJECTIVE or not g.outputs:
        return None
    outs = [graph[o] for o in g.outputs]
    if not all(graph.is_output(o.name) or o.tensor_type.numel == 1 for o in outs):
        return None
    if any(o.tensor_type.numel == 0 for o in outs):
        return None
    # The dtype of the updates it writes, not of a scalar it passes on (a bias correction in fp64).
    key = [o for o in outs if graph.is_output(o.name)] or outs
    return max(key, key=lambda n: n.tensor_type.numel).tensor_type.dtype


def _can_join(
    i: int, groups: Sequence[Group], producers: list[list[int]], ancestors: list[int], mask: int, graph: Graph
) -> bool:
    for p in producers[i]:
        if mask >> p & 1:
            read = set(groups[i].inputs) & set(groups[p].outputs)
            if any(graph[v].tensor_type.numel != 1 for v in read):
                return False
        elif ancestors[p] & mask:
            return False  # a producer outside the batch depends on a member: a cycle
    return True


def _decision(groups: Sequence[Group], batch: list[int], dtype: DType) -> Decision:
    names = [g.nodes[-1] for g in (groups[i] for i in batch)]
    reason = f"{len(batch)} independent pointwise kernels ({dtype.value}) run as one horizontal kernel"
    return Decision(tuple(names[:1]), tuple(names[1:]), True, Rule.HORIZONTAL, reason, None, horizontal=True)


def _regroup(
    graph: Graph, groups: Sequence[Group], merged: dict[tuple[DType, int], list[int]], launch_s: float
) -> tuple[Group, ...]:
    """The groups with each batch replaced by one group, in an order every input respects."""
    into = {m: k for k, b in merged.items() for m in b}
    items: list[tuple[int, Group]] = []  # (position of its last member, group)
    done: set[tuple[DType, int]] = set()
    for i, g in enumerate(groups):
        if i not in into:
            items.append((i, g))
        elif into[i] not in done:
            done.add(into[i])
            batch = merged[into[i]]
            items.append((batch[-1], _merge(graph, [groups[m] for m in batch], groups, set(batch), launch_s)))
    order = _topological([g for _, g in sorted(items, key=lambda t: t[0])])
    return tuple(dataclasses.replace(g, id=k) for k, g in enumerate(order))


def _merge(graph: Graph, members: list[Group], groups: Sequence[Group], batch: set[int], launch_s: float) -> Group:
    nodes = {n for g in members for n in g.nodes}
    ordered = tuple(n.name for n in graph if n.name in nodes)
    read_outside = {v for i, g in enumerate(groups) if i not in batch for v in g.inputs}
    outputs = tuple(dict.fromkeys(o for g in members for o in g.outputs if graph.is_output(o) or o in read_outside))
    inputs = tuple(dict.fromkeys(v for g in members for v in g.inputs if v not in nodes))
    kind = Kind(max(g.kind for g in members))
    return Group(members[0].id, ordered, kind, LABEL, inputs, outputs, _cost([g.cost for g in members], launch_s))


def _cost(costs: list[Cost], launch_s: float) -> Cost:
    """The members' figures summed, with one launch instead of one each."""
    time_s = sum(c.time_s for c in costs) - (len(costs) - 1) * launch_s
    return Cost(
        sum(c.flops for c in costs),
        sum(c.bytes for c in costs),
        sum(c.compute_s for c in costs),
        sum(c.memory_s for c in costs),
        launch_s,
        max(time_s, launch_s),
        max(c.pressure for c in costs),
        sum(c.parallelism for c in costs),
    )


def _topological(groups: list[Group]) -> list[Group]:
    """Kahn's order over the groups' data dependencies, stable in the given order."""
    made = {o: k for k, g in enumerate(groups) for o in g.outputs}
    preds = [{made[v] for v in g.inputs if v in made and made[v] != k} for k, g in enumerate(groups)]
    users: list[list[int]] = [[] for _ in groups]
    for k, ps in enumerate(preds):
        for p in ps:
            users[p].append(k)
    waiting = [len(ps) for ps in preds]
    ready = [k for k, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out: list[Group] = []
    while ready:
        k = heapq.heappop(ready)
        out.append(groups[k])
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(out) != len(groups):
        raise AssertionError("horizontal fusion made a cycle")  # _can_join rules this out
    return out
