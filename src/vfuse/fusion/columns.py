"""Column sums into GEMM epilogues: a bias gradient `sum(dH, 0)` joins the GEMM group making dH.

In backward, a linear layer's bias gradient sums the gradient dH over its rows, and dH is the
output (or an epilogue value) of a GEMM group: run as a kernel of its own, the sum re-reads all
of dH from memory. The GEMM template can add each output tile's rows while they are in
registers instead (`codegen/cpp/gemm/driver.py`: per-sliver partials, a fixed-order reduce).

This pass runs after the planner on CPU targets. A group that is exactly such a sum (one SUM of
an fp32 value over every dim but the last, then reshapes of the sum only) joins the "gemm"
group writing that value when the value's columns are the GEMM's columns (same last dim, same
element count) and something else still reads the value (the template stores it anyway; a
value only the sum reads would be a different trade). One column sum per GEMM group. The
schedule (`schedule/contraction.py`) runs it in the template, or, when it cannot (a library
GEMM, a split epilogue, symbolic sizes), as the row kernel it was before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vfuse.fusion.plan import Cost, Decision, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.ir import DType, Graph, Op
from vfuse.ir.shapes import numel
from vfuse.ir.sym import same

LABEL = "gemm"


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnSum:
    """A column sum in a group: `value` summed over its rows, written as `out`, by `nodes`
    (the SUM, then the reshapes of it)."""

    value: str
    out: str
    nodes: frozenset[str]


def column_sum(graph: Graph, nodes: Sequence[str], outputs: Sequence[str]) -> ColumnSum | None:
    """The column sum made by exactly `nodes` writing `outputs`, or None: one SUM of an fp32
    value over every dim but the last, the other nodes a chain of reshapes of it, one output."""
    sums = [n for n in nodes if graph[n].op is Op.SUM]
    if len(sums) != 1 or len(outputs) != 1:
        return None
    s = graph[sums[0]]
    x = graph[s.inputs[0]].tensor_type
    if x.rank < 2 or x.dtype is not DType.F32 or s.tensor_type.dtype is not DType.F32:
        return None
    if sorted(a % x.rank for a in s.attrs["axes"]) != list(range(x.rank - 1)):
        return None
    chain, v = {s.name}, s.name
    for n in nodes:
        if n != s.name:
            node = graph[n]
            if node.op is not Op.RESHAPE or node.inputs[0] != v:
                return None
            chain.add(n)
            v = n
    if v != outputs[0]:
        return None
    return ColumnSum(s.inputs[0], v, frozenset(chain))


def gemm_columns(graph: Graph, nodes: Sequence[str], value: str) -> bool:
    """`value` (written by a group of `nodes`) has the columns of the group's MATMUL: the same
    last dim and element count, so its flat index modulo N is the GEMM's column."""
    mm = [graph[n] for n in nodes if graph[n].op is Op.MATMUL]
    if len(mm) != 1:
        return False
    out, x = mm[0].tensor_type.shape, graph[value].tensor_type.shape
    return same(out[-1], x[-1]) and same(numel(out), numel(x))


def fold_column_sums(plan: FusionPlan) -> FusionPlan:
    """`plan` with each column-sum group merged into the GEMM group writing what it sums."""
    graph, groups = plan.graph, plan.groups
    made = {o: i for i, g in enumerate(groups) for o in g.outputs}
    readers: dict[str, int] = {}
    for g in groups:
        for v in g.inputs:
            readers[v] = readers.get(v, 0) + 1
    into: dict[int, int] = {}  # column-sum group -> GEMM group
    for i, g in enumerate(groups):
        cs = column_sum(graph, g.nodes, g.outputs) if g.label in ("reduction", "row") else None
        if cs is None or g.inputs != (cs.value,) or cs.value not in made:
            continue
        c = made[cs.value]
        gemm = groups[c]
        shared = readers[cs.value] > 1 or graph.is_output(cs.value)
        if gemm.label == LABEL and c not in into.values() and shared and gemm_columns(graph, gemm.nodes, cs.value):
            into[i] = c
    if not into:
        return plan
    merged = {c: _merge(graph, groups[c], groups[i]) for i, c in into.items()}
    kept = [merged.get(k, g) for k, g in enumerate(groups) if k not in into]
    decisions = [*plan.decisions, *(_decision(groups[c], groups[i]) for i, c in into.items())]
    new = tuple(dataclasses.replace(g, id=k) for k, g in enumerate(kept))
    return dataclasses.replace(plan, groups=new, decisions=tuple(decisions))


def _merge(graph: Graph, gemm: Group, sums: Group) -> Group:
    members = set(gemm.nodes) | set(sums.nodes)
    ordered = tuple(n.name for n in graph if n.name in members)
    outputs = gemm.outputs + sums.outputs
    return Group(gemm.id, ordered, gemm.kind, gemm.label, gemm.inputs, outputs, _cost(graph, gemm, sums))


def _cost(graph: Graph, gemm: Group, sums: Group) -> Cost:
    """The GEMM's figures plus the sum's adds and its (small) output: dH is not read again."""
    g, s = gemm.cost, sums.cost
    out = sum(graph[o].tensor_type.nbytes for o in sums.outputs)
    return Cost(
        g.flops + s.flops,
        g.bytes + out,
        g.compute_s + s.compute_s,
        g.memory_s,
        g.launch_s,
        g.time_s + s.compute_s,
        g.pressure,
        g.parallelism,
    )


def _decision(gemm: Group, sums: Group) -> Decision:
    saved = sums.cost.time_s - sums.cost.compute_s
    reason = f"column sum added up in the {LABEL} kernel's tiles; its re-read of the summed value is gone"
    return Decision(gemm.nodes[-1:], sums.nodes, True, Rule.COLUMN_SUM_EPILOGUE, reason, saved)
