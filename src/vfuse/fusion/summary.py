"""Compositional kernel summaries: what the planner needs about a kernel, combined in O(boundary).

Scoring a candidate merge must not walk every node of two large kernels (a 10,000-node graph
is planned in well under a second), so each kernel carries a Summary, and the summary of P u C
is computed from P's and C's: set unions for names/inputs/outputs, per-shape flop sums, and
bounds for on-chip pressure (live(P u C) <= max(live(P) + values passed P -> C, live(C))).
Contraction kernels are small and irregular (prologue/epilogue), so they are classified and
costed exactly from their nodes (`forms.classify`, `cost.kernel_cost`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from vfuse.fusion.cost import (
    Figures,
    Pressure,
    after,
    attention_extra_s,
    chain_factor,
    cost_from,
    fixed_rate,
    gather_flops,
    register_budget,
    registers,
    template_extra_s,
    time_weight,
    transcendental,
    ws_budget,
)
from vfuse.fusion.forms import CONTRACTION_LABELS, Form, Illegal, numel_of, per_element_flops
from vfuse.fusion.library import pointwise_choice
from vfuse.fusion.plan import Cost
from vfuse.fusion.rules import Rule
from vfuse.ir import Graph, Kind, Node, TensorType, opdef
from vfuse.ir.shapes import numel
from vfuse.ir.sym import hint, is_sym, proved, same
from vfuse.targets import Target

ReduceSig = tuple[tuple[int, ...], tuple[int, ...], int]  # (full shape, axes, rows)


@dataclass(frozen=True, slots=True)
class Facts:
    """Per-node figures, computed once per planning run."""

    kind: Kind
    shape: tuple[int, ...]
    numel: int
    nbytes: int
    pe: float  # flops per output element (pointwise nodes)
    fixed_flops: int  # reductions and contractions: total flops
    fixed_s: float  # their compute seconds on the target
    layout: bool
    sig: ReduceSig | None
    regs: int  # 32-bit registers per element
    transcendental: bool = False  # priced apart from cheap arithmetic (cost.transcendental)
    template_s: float = 0.0  # a contraction's template overheads (in fixed_s: `cost.template_extra_s`)
    library_s: float = 0.0  # torch's library's overheads in their place (`Cost.library_extra_s`)
    in_torch: str = ""  # why a scalar-libm node runs in torch, alone (`library.pointwise_choice`)


def node_facts(node: Node, graph: Graph, target: Target) -> Facts:
    shape = node.type.shape if isinstance(node.type, TensorType) else ()
    fixed, fixed_s, sig, template_s, library_s = 0, 0.0, None, 0.0, 0.0
    if node.kind in (Kind.REDUCE, Kind.CONTRACTION):
        fixed = opdef(node.op).flops(tuple(graph[i].type for i in node.inputs), node.type, node.attrs)  # type: ignore[arg-type]
        first = graph[node.inputs[0]].tensor_type
        fixed = hint(fixed)  # costs at the example sizes (ir/sym.py)
        fixed_s = fixed / fixed_rate(node, graph, target)
        if node.kind is Kind.REDUCE:
            sig = (first.shape, tuple(node.attrs["axes"]), numel_of(node))
    if node.kind is Kind.CONTRACTION:
        # A calibrated contraction's time past its flops, as the exact cost has it (cost._flops): without
        # it a GEMM + epilogue costed from summaries was faster than the exact cost of the same kernel
        # with one more prologue node, and such merges were scored as losing the template's overheads.
        template_s, library_s = template_extra_s(node, graph, target), template_extra_s(node, graph, target, True)
        fixed_s += template_s + attention_extra_s(node, graph, target, fixed)
    # In cheap-arithmetic flops: transcendental ops weigh more on a calibrated target (cost.time_weight).
    pe = 0.0 if fixed else per_element_flops(node, graph) * time_weight(node, graph, target)
    pe += gather_flops(node, graph, target)  # an interleave's gathered loads (fusion/gathers.py)
    layout = opdef(node.op).layout_only
    return Facts(
        node.kind,
        shape,
        numel_of(node),  # symbolic sizes stay symbolic: legality compares them (cost reads hints)
        hint(node.type.nbytes),
        pe,
        fixed,
        fixed_s,
        layout,
        sig,
        registers(node.type),
        transcendental(node, graph, target),
        template_s,
        library_s,
        _in_torch(node, graph, target),
    )


def _in_torch(node: Node, graph: Graph, target: Target) -> str:
    choice = pointwise_choice(node, graph, target)
    return choice.reason() if choice is not None and choice.torch else ""


@dataclass(frozen=True, slots=True)
class Summary:
    names: frozenset[str]
    inputs: frozenset[str]
    outputs: frozenset[str]
    contractions: int
    sig: ReduceSig | None
    opaque: bool
    pe: Mapping[tuple[int, ...], float]  # summed flops/element of pointwise nodes, by shape
    fixed_flops: int
    fixed_s: float
    live: int  # bound on values live at once per point
    persist: int  # bytes per row element kept on chip across the passes of a row kernel
    depth: int  # dependent reductions in a row (passes - 1)
    reduces: bool
    layout_only: bool
    top: Kind  # the highest op kind in the kernel
    out_numel: int = 0  # a contraction kernel's output size (its epilogue's domain)
    label: str = ""  # a contraction kernel's label (gemm, conv, attention)
    pro_flops: int = 0  # flops of a contraction's operand prologue (evaluated at operand size)
    template_s: float = 0.0  # of fixed_s, the contraction template's overheads (`Cost.template_s`)
    library_s: float = 0.0  # torch's library's overheads in their place (`Cost.library_extra_s`)
    # The loop (`cost.loop_levels`) an output's or a transcendental node's value is read in, past the
    # kernel's inputs; and the transcendental nodes per loop (`cost.chain_factor`).
    levels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    chains: tuple[int, ...] = ()
    kept: frozenset[str] = frozenset()  # the values `persist` counts (each once, however many merges see it)
    in_torch: str = ""  # a scalar-libm node kept in torch: why (`Facts.in_torch`); it merges with nothing

    @property
    def transcendental(self) -> int:
        return sum(self.chains)


def leaf(facts: Facts, node: Node, outputs: frozenset[str], all_facts: Mapping[str, Facts]) -> Summary:
    """Summary of a kernel of one node."""
    pe = {} if facts.fixed_flops or facts.kind is Kind.OPAQUE else {facts.shape: facts.pe}
    return Summary(
        frozenset((node.name,)),
        frozenset(node.inputs),
        outputs,
        int(facts.kind is Kind.CONTRACTION),
        facts.sig,
        facts.kind is Kind.OPAQUE or bool(facts.in_torch),
        pe,
        facts.fixed_flops,
        facts.fixed_s,
        sum(all_facts[i].regs for i in set(node.inputs)) + facts.regs,
        0,
        0,
        facts.kind is Kind.REDUCE,
        facts.layout,
        facts.kind,
        facts.numel if facts.kind is Kind.CONTRACTION else 0,
        CONTRACTION_LABELS.get(node.op, ""),
        0,
        facts.template_s,
        facts.library_s,
        {node.name: after(node)},
        (1,) if facts.transcendental else (),
        in_torch=facts.in_torch,
    )


def combine(p: Summary, c: Summary, outputs: frozenset[str], facts: Mapping[str, Facts]) -> Summary:
    """Summary of P u C (P the producer), given the union's outputs."""
    names = p.names | c.names
    pe = dict(p.pe)
    for shape, f in c.pe.items():
        pe[shape] = pe.get(shape, 0.0) + f
    fixed, fixed_s = p.fixed_flops + c.fixed_flops, p.fixed_s + c.fixed_s
    template_s, library_s = p.template_s + c.template_s, p.library_s + c.library_s
    for v in p.names & c.names:  # a recomputed node both kernels hold is computed once
        f = facts[v]
        template_s, library_s = template_s - f.template_s, library_s - f.library_s
        if f.fixed_flops:
            fixed, fixed_s = fixed - f.fixed_flops, fixed_s - f.fixed_s
        else:
            pe[f.shape] -= f.pe
    passed = c.inputs & p.names
    sig = p.sig or c.sig
    kept = p.kept | c.kept | (_crossing(p, c, passed, sig, facts) if p.reduces and sig else frozenset())
    return Summary(
        names,
        (p.inputs | c.inputs) - names,
        outputs,
        p.contractions + c.contractions,
        sig,
        p.opaque or c.opaque,
        pe,
        fixed,
        fixed_s,
        max(p.live + sum(facts[v].regs for v in passed), c.live),
        sum(facts[v].nbytes // max(hint(facts[v].numel), 1) for v in kept),
        p.depth + c.depth + int(p.reduces and c.reduces),
        p.reduces or c.reduces,
        p.layout_only and c.layout_only,
        max(p.top, c.top),
        max(p.out_numel, c.out_numel),
        p.label or c.label,
        p.pro_flops + c.pro_flops,
        template_s,
        library_s,
        *_levels(p, c, passed, outputs, facts),
        kept,
        p.in_torch or c.in_torch,
    )


def _levels(
    p: Summary, c: Summary, passed: frozenset[str], outputs: frozenset[str], facts: Mapping[str, Facts]
) -> tuple[dict[str, int], tuple[int, ...]]:
    """`Summary.levels` and `chains` of P u C: C's loops start at the latest one of the values P
    passes it (a bound: C's nodes that read only other inputs may run in an earlier loop)."""
    offset = max((p.levels.get(v, 0) for v in passed), default=0)
    levels = {v: n for v, n in p.levels.items() if v in outputs or facts[v].transcendental}
    for v, n in c.levels.items():
        if v not in p.names and (v in outputs or facts[v].transcendental):
            levels[v] = n + offset
    chains = Counter(n for v, n in levels.items() if facts[v].transcendental)
    return levels, tuple(chains.values())


def with_prologue(s: Summary, form: Form, facts: Mapping[str, Facts]) -> Summary:
    """A contraction kernel's summary with its operand prologue split out of the per-shape
    flops (prologue nodes are evaluated at their own size, the epilogue at the output's)."""
    pe: dict[tuple[int, ...], float] = {}
    pro = 0.0
    for v in s.names:
        f = facts[v]
        if f.fixed_flops or f.kind is Kind.CONTRACTION:
            continue
        if hint(form.space.get(v, form.domain)) == hint(form.domain):  # flop accounting: at the hints
            pe[f.shape] = pe.get(f.shape, 0.0) + f.pe
        else:
            pro += f.pe * hint(f.numel)
    return dataclasses.replace(s, pe=pe, pro_flops=int(pro))


def _fits(shape: tuple[int, ...], into: tuple[int, ...]) -> bool:
    """Whether `shape` broadcasts into `into`; symbolic sizes compared structurally (a "no" only
    keeps the values apart)."""
    if len(shape) > len(into):
        return False
    return all(
        (not is_sym(d) and d == 1) or same(d, e) for d, e in zip(shape, into[len(into) - len(shape) :], strict=True)
    )


def _crossing(
    p: Summary, c: Summary, passed: frozenset[str], sig: ReduceSig, facts: Mapping[str, Facts]
) -> frozenset[str]:
    """The producer's full-row values (or shared full-row inputs) that the consumer re-reads
    after the producer's reduction: they must stay on chip."""
    full = numel(sig[0])
    return frozenset(v for v in passed | (p.inputs & c.inputs) if same(facts[v].numel, full))


def quick_illegal(p: Summary, c: Summary) -> Illegal | None:
    """The kind rules that need no combined summary (most rejected pairs stop here)."""
    if p.in_torch or c.in_torch:
        return Illegal(Rule.LIBRARY_POINTWISE, p.in_torch or c.in_torch)
    if p.opaque or c.opaque:
        return Illegal(Rule.OPAQUE_ALONE, "a torch fallback runs alone (with its get_items)")
    if p.contractions and c.contractions:
        return Illegal(Rule.TWO_CONTRACTIONS, "at most one contraction per kernel")
    if (p.contractions and c.reduces) or (p.reduces and c.contractions):
        return Illegal(Rule.CONTRACTION_WITH_REDUCTION, "a contraction kernel takes only a pointwise epilogue")
    return None


def form_of(s: Summary, p: Summary, c: Summary, facts: Mapping[str, Facts]) -> Form | Illegal | None:
    """The kernel form of a combined summary; None when it needs the exact (node-level) check."""
    if s.opaque:
        return Illegal(Rule.OPAQUE_ALONE, "a torch fallback runs alone (with its get_items)")
    if s.contractions > 1:
        return Illegal(Rule.TWO_CONTRACTIONS, "at most one contraction per kernel")
    if s.contractions and s.reduces:
        return Illegal(Rule.CONTRACTION_WITH_REDUCTION, "a contraction kernel takes only a pointwise epilogue")
    if s.contractions:
        return _epilogue_form(s, p, c, facts)
    if s.sig:
        return _row_form(s, p, c)
    sizes = {facts[o].numel for o in s.outputs}
    if len(sizes) > 1:
        return Illegal(Rule.POINTWISE_OUTPUTS_DIFFER, f"outputs of one pointwise kernel differ in size {sorted(sizes)}")
    domain = sizes.pop() if sizes else max(numel(shape) for shape in s.pe)
    return Form("view" if s.layout_only else "pointwise", s.top, domain, 0, {})


def _epilogue_form(s: Summary, p: Summary, c: Summary, facts: Mapping[str, Facts]) -> Form | Illegal | None:
    """A contraction kernel P taking plain elementwise consumer C as epilogue; anything else
    (prologues, views) goes to the exact node-level check (None)."""
    if not p.contractions or c.contractions or c.top > Kind.ELEMENTWISE or c.opaque:
        return None
    out = s.out_numel
    # Sizes compare without guards: "illegal" unless proved (symbolic sizes: a "no" is safe).
    if any(not proved(numel(shape), "<=", out) for shape in c.pe):
        return Illegal(Rule.EPILOGUE_SPACE_MISMATCH, f"a consumer value is larger than the output ({out} elements)")
    if any(not same(facts[o].numel, out) for o in s.outputs):
        return Illegal(Rule.EPILOGUE_SPACE_MISMATCH, f"a written value is not in the output space ({out} elements)")
    return Form(s.label, Kind.CONTRACTION, out, 0, {})


def _row_form(s: Summary, p: Summary, c: Summary) -> Form | Illegal:
    assert s.sig is not None
    if p.sig and c.sig and not same(p.sig, c.sig):  # structural: reductions over s0 and s1 differ, no guard
        rule = Rule.REDUCE_SHAPES_DIFFER if not same(p.sig[0], c.sig[0]) else Rule.REDUCE_AXES_DIFFER
        return Illegal(rule, f"reductions of {p.sig[0]} over {p.sig[1]} and of {c.sig[0]} over {c.sig[1]}")
    full_shape, _, rows = s.sig
    full = numel(full_shape)
    for shape in s.pe:
        n = numel(shape)
        if not same(n, full) and not same(n, rows) and not _fits(shape, full_shape):  # structural: "no" is safe
            why = f"a {shape} value is neither in the row space {full_shape} nor reduced"
            return Illegal(Rule.ROW_SPACE_MISMATCH, why)
    label = "row" if s.pe else "reduction"
    return Form(label, Kind.REDUCE, full, rows, {})


def summary_cost(s: Summary, form: Form, nbytes: Mapping[str, int], target: Target) -> tuple[Cost, Pressure]:
    """Cost of a kernel from its summary (same equations as cost.kernel_cost): any but a contraction
    with a prologue, which is costed from its nodes (`groups.KernelTable._exact`)."""
    flops = s.fixed_flops + s.pro_flops
    for shape, f in s.pe.items():
        n, rows, domain = hint(numel(shape)), hint(form.rows), hint(form.domain)
        flops += int(f * (rows if rows and n == rows else domain))
    # Pointwise and prologue work (per-element flops already weighted per op: node_facts).
    compute_s = s.fixed_s + (flops - s.fixed_flops) / target.vector_f32 * chain_factor(s.chains, target)
    in_bytes = sum(map(nbytes.__getitem__, s.inputs))
    out_bytes = sum(map(nbytes.__getitem__, s.outputs))
    row_len = hint(form.domain) // hint(form.rows) if form.rows else 0
    pressure = Pressure(s.live, register_budget(target, form.kind), row_len * s.persist, ws_budget(target), s.depth + 1)
    kind, domain, rows = form.kind, form.domain, form.rows
    fig = Figures(flops, compute_s, in_bytes, out_bytes, kind, domain, rows, pressure, s.template_s, 0, s.library_s)
    return cost_from(fig, target), pressure
