"""Legality: may producer group P merge into consumer group C? Every rule has a stable name
(used in Decision.rule) and a one-line reason.

Allowing rules (by op kind, ARCHITECTURE.md): elementwise-into-any, view-index-map,
prologue-into-reduction, epilogue-after-reduction, multi-pass-row, epilogue-after-contraction,
prologue-into-contraction. Forbidding rules come from the kernel forms (`forms.classify`:
two-contractions, contraction-with-reduction, reduce-axes-differ, reduce-shapes-differ,
row-space-mismatch, epilogue-space-mismatch, prologue-too-expensive, view-not-expressible,
pointwise-outputs-differ, opaque-alone), from the kernel graph (would-create-cycle, checked by
`groups.KernelTable.forward`) and from
resource budgets (kernel-size-cap, register-budget, cache-budget, smem-budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vfuse.fusion.cost import Pressure, pressure_of
from vfuse.fusion.forms import Form, Illegal, classify
from vfuse.fusion.rules import Rule
from vfuse.fusion.summary import Summary
from vfuse.ir import Graph, Kind, Node
from vfuse.targets import Target


@dataclass(frozen=True, slots=True)
class NodeCap:
    """At most `cap` of `nodes` in one kernel: a group measured too big on chip (`fusion/onchip.py`)."""

    nodes: frozenset[str]
    cap: int
    rule: Rule  # ONCHIP_SPILLS or ONCHIP_SHARED
    why: str  # the measured figures


@dataclass(frozen=True, slots=True)
class Budgets:
    """Hard limits on one kernel. max_nodes bounds kernel complexity (compile time, code size,
    instruction cache and scheduler pressure grow with it); caps split groups measured on chip."""

    max_nodes: int = 256
    caps: tuple[NodeCap, ...] = ()

    def cap_violation(self, names: frozenset[str]) -> Illegal | None:
        for c in self.caps:
            if len(names & c.nodes) > c.cap:
                return Illegal(c.rule, f"at most {c.cap} of the {len(c.nodes)} nodes of a kernel that measured {c.why}")
        return None


def budget_violation(n_nodes: int, p: Pressure, target: Target, budgets: Budgets) -> Illegal | None:
    """The resource budget a kernel of `n_nodes` nodes under pressure `p` breaks, if any."""
    if n_nodes > budgets.max_nodes:
        return Illegal(Rule.KERNEL_SIZE_CAP, f"{n_nodes} nodes > cap of {budgets.max_nodes}")
    if target.is_gpu and p.live > p.reg_budget:
        return Illegal(
            Rule.REGISTER_BUDGET, f"{p.live} live values per point > {p.reg_budget} registers per thread (would spill)"
        )
    if p.ws_budget and p.working_set > p.ws_budget:
        rule = Rule.SMEM_BUDGET if target.is_gpu else Rule.CACHE_BUDGET
        where = "shared memory per SM" if target.is_gpu else "L2 per core"
        return Illegal(rule, f"row working set {p.working_set} B > {p.ws_budget} B {where}")
    return None


def check_kernel(
    nodes: Sequence[Node], outputs: Sequence[str], graph: Graph, target: Target, budgets: Budgets
) -> Form | Illegal:
    """The form of `nodes` as one kernel if it has one and fits the target's budgets (exact,
    node-level check; the planner uses the compositional equivalent in `summary`)."""
    form = classify(nodes, outputs, graph)
    if isinstance(form, Illegal):
        return form
    return budget_violation(len(nodes), pressure_of(nodes, form, graph, target), target, budgets) or form


def allowing_rule(producer: Summary, consumer: Summary, form: Form) -> Rule:
    """Name of the kind rule under which a legal merge of producer into consumer happens."""
    if form.kind is Kind.CONTRACTION:
        return Rule.EPILOGUE_AFTER_CONTRACTION if producer.contractions else Rule.PROLOGUE_INTO_CONTRACTION
    if form.kind is Kind.REDUCE:
        if producer.reduces and consumer.reduces:
            return Rule.MULTI_PASS_ROW
        return Rule.EPILOGUE_AFTER_REDUCTION if producer.reduces else Rule.PROLOGUE_INTO_REDUCTION
    if producer.layout_only:
        return Rule.VIEW_INDEX_MAP
    return Rule.ELEMENTWISE_INTO_ANY
