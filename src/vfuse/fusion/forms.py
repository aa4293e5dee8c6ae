"""Kernel forms: which node sets one generated kernel can run, and over which iteration space.

The planner may only form groups of these shapes (the contract with the code generators):
- pointwise: ELEMENTWISE/BROADCAST/INJECTIVE nodes; the domain is the outputs' shape.
- reduction / row: REDUCE nodes over the same axes of same-shaped inputs (the full space),
  plus pointwise nodes in the full space or in the reduced space (one row per work item).
- gemm / conv / attention: one CONTRACTION, a pointwise epilogue in its output space, and
  cheap pointwise prologues feeding only the contraction.
- opaque: one OPAQUE node and its GET_ITEMs.
`classify` returns the Form of a node set, or an Illegal naming the broken rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vfuse.fusion.rules import Rule
from vfuse.ir import Graph, Kind, Node, Op, TensorType, opdef
from vfuse.ir.shapes import ShapeError, broadcast, numel
from vfuse.ir.sym import hint

POINTWISE_KINDS = frozenset({Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE})
CONTRACTION_LABELS = {
    Op.MATMUL: "gemm",
    Op.CONV2D: "conv",
    Op.SDPA: "attention",
    Op.SDPA_LSE: "attention",
    Op.SDPA_BACKWARD: "attention-backward",
    Op.SCATTER_ADD: "scatter-add",
}
# A contraction re-reads operand tiles many times, so a prologue is only worth it when it is a
# few instructions per element (cast, zero-point subtract, scale multiply).
PROLOGUE_MAX_FLOPS_PER_ELEMENT = 4
# Except on a MATMUL's B: the GEMM template packs each B element exactly once per batch entry
# (codegen/cpp/gemm/prologue.py), so a dearer prologue there (a GELU recomputed in backward)
# costs its flops once instead of a store and a re-read of the whole operand; allowed while it
# stays within this share of the contraction's flops per B element (2 M).
PACKED_ONCE_SHARE = 1 / 16


@dataclass(frozen=True, slots=True)
class Form:
    """A legal kernel shape.

    domain: iteration points of the main space (pointwise: output numel; row: full-space numel;
        contraction: output numel). rows: independent rows of a row kernel (reduced numel), else 0.
    space: for each node, how many points it is evaluated at (its flops scale with it).
    """

    label: str
    kind: Kind
    domain: int
    rows: int
    space: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Illegal:
    rule: Rule
    reason: str


def numel_of(node: Node) -> int:
    return node.type.numel if isinstance(node.type, TensorType) else 0


def per_element_flops(node: Node, graph: Graph) -> float:
    """The op's flops divided by its output size (instructions to compute one element)."""
    n = hint(numel_of(node))  # cost figures are taken at the example sizes (ir/sym.py)
    if n == 0:
        return 0.0
    ins = tuple(graph[i].type for i in node.inputs)
    return hint(opdef(node.op).flops(ins, node.type, node.attrs)) / n  # type: ignore[arg-type]


def classify(nodes: Sequence[Node], outputs: Sequence[str], graph: Graph) -> Form | Illegal:
    """The kernel form of `nodes` (topologically ordered) writing `outputs`, or why it has none."""
    kinds = [n.kind for n in nodes]
    if Kind.OPAQUE in kinds:
        return _opaque_form(nodes)
    contractions = [n for n in nodes if n.kind is Kind.CONTRACTION]
    if len(contractions) > 1:
        names = ", ".join(f"%{c.name}" for c in contractions)
        return Illegal(Rule.TWO_CONTRACTIONS, f"at most one contraction per kernel, got {names}")
    has_reduce = Kind.REDUCE in kinds
    if contractions and has_reduce:
        return Illegal(Rule.CONTRACTION_WITH_REDUCTION, "a contraction kernel takes only a pointwise epilogue")
    if contractions:
        return _contraction_form(nodes, contractions[0], outputs, graph)
    if has_reduce:
        return _row_form(nodes, graph)
    return _pointwise_form(nodes, outputs, graph)


def _opaque_form(nodes: Sequence[Node]) -> Form | Illegal:
    opaque = [n for n in nodes if n.op is Op.OPAQUE]
    if len(opaque) != 1 or any(n.op not in (Op.OPAQUE, Op.GET_ITEM) for n in nodes):
        return Illegal(Rule.OPAQUE_ALONE, "a torch fallback runs alone (with its get_items)")
    return Form("opaque", Kind.OPAQUE, 0, 0, {n.name: 0 for n in nodes})


def _pointwise_form(nodes: Sequence[Node], outputs: Sequence[str], graph: Graph) -> Form | Illegal:
    sizes = {numel_of(graph[o]) for o in outputs}
    if len(sizes) > 1:
        return Illegal(Rule.POINTWISE_OUTPUTS_DIFFER, f"outputs of one pointwise kernel differ in size {sorted(sizes)}")
    domain = sizes.pop() if sizes else max(numel_of(n) for n in nodes)
    label = "view" if all(opdef(n.op).layout_only for n in nodes) else "pointwise"
    return Form(label, Kind(max(n.kind for n in nodes)), domain, 0, {n.name: domain for n in nodes})


def _fits(shape: tuple[int, ...], into: tuple[int, ...]) -> bool:
    try:
        return broadcast(shape, into) == into
    except ShapeError:
        return False


def _row_form(nodes: Sequence[Node], graph: Graph) -> Form | Illegal:
    reduces = [n for n in nodes if n.kind is Kind.REDUCE]
    full_shapes = {graph[r.inputs[0]].tensor_type.shape for r in reduces}
    if len(full_shapes) > 1:
        return Illegal(Rule.REDUCE_SHAPES_DIFFER, f"reductions over inputs of shapes {sorted(full_shapes)}")
    axes = {tuple(r.attrs["axes"]) for r in reduces}
    if len(axes) > 1:
        return Illegal(Rule.REDUCE_AXES_DIFFER, f"reductions over different axes {sorted(axes)}")
    full_shape = full_shapes.pop()
    full, rows = numel(full_shape), numel_of(reduces[0])
    space: dict[str, int] = {}
    for n in nodes:
        size = numel_of(n)
        if n.kind is Kind.REDUCE or size == full:
            space[n.name] = full
        elif size == rows:
            space[n.name] = rows
        elif _fits(n.tensor_type.shape, full_shape):
            space[n.name] = full  # a broadcast parameter, evaluated at every point that reads it
        else:
            rule = Rule.VIEW_NOT_EXPRESSIBLE if opdef(n.op).layout_only else Rule.ROW_SPACE_MISMATCH
            return Illegal(rule, f"%{n.name} {n.type} is neither in the row space {full_shape} nor reduced")
    label = "reduction" if all(n.kind is Kind.REDUCE for n in nodes) else "row"
    return Form(label, Kind.REDUCE, full, rows, space)


def _contraction_form(nodes: Sequence[Node], c: Node, outputs: Sequence[str], graph: Graph) -> Form | Illegal:
    inside = {n.name for n in nodes}
    before = graph.ancestors(c.name, inside)
    after = _descendants(c.name, inside, graph)
    once = packed_once(c, inside, graph)
    out_size = numel_of(c)
    space: dict[str, int] = {c.name: out_size}
    for n in nodes:
        if n is c:
            continue
        if n.kind not in POINTWISE_KINDS:
            return Illegal(Rule.CONTRACTION_EPILOGUE_KIND, f"%{n.name} ({n.op.value}) cannot join a contraction")
        if n.name in before:
            cheap = per_element_flops(n, graph) <= PROLOGUE_MAX_FLOPS_PER_ELEMENT or n.name in once
            if n.name in outputs or not cheap:
                return Illegal(Rule.PROLOGUE_TOO_EXPENSIVE, f"%{n.name} ({n.op.value}) is not a cheap operand prologue")
            space[n.name] = numel_of(n)
        elif n.op is Op.PERMUTE and n.name in after and not _undone(n, graph, inside):
            # The templates store their output tile in the contraction's own order (a reshape of
            # it at most): a permuted epilogue would be split off and stored twice (schedule).
            return Illegal(Rule.EPILOGUE_SPACE_MISMATCH, f"%{n.name} permutes the output of %{c.name}")
        elif numel_of(n) == out_size or (n.name not in after and numel_of(n) < out_size):
            space[n.name] = out_size
        else:
            rule = Rule.VIEW_NOT_EXPRESSIBLE if opdef(n.op).layout_only else Rule.EPILOGUE_SPACE_MISMATCH
            return Illegal(rule, f"%{n.name} {n.type} is not in the output space of %{c.name}")
    bad = [o for o in outputs if o != c.name and o not in after]
    if bad:
        return Illegal(Rule.EPILOGUE_SPACE_MISMATCH, f"%{bad[0]} is written but is not in the epilogue of %{c.name}")
    return Form(CONTRACTION_LABELS[c.op], Kind.CONTRACTION, out_size, 0, space)


def packed_once(c: Node, inside: set[str], graph: Graph) -> set[str]:
    """The in-group prologue nodes that feed only a MATMUL's B, whose elements the template packs
    once per batch entry (B not broadcast over the batch), when their flops per element together
    stay within PACKED_ONCE_SHARE of the product's flops per B element; else empty."""
    if c.op is not Op.MATMUL or len(c.inputs) != 2:
        return set()
    a, b = c.inputs
    b_type, out = graph[b].tensor_type, c.tensor_type
    if hint(numel(b_type.shape[:-2])) != hint(numel(out.shape[:-2])):
        return set()
    feeds_a = graph.ancestors(a, inside) | ({a} & inside)
    feeds_b = (graph.ancestors(b, inside) | ({b} & inside)) - feeds_a
    flops = sum(per_element_flops(graph[v], graph) for v in feeds_b)
    return feeds_b if flops <= PACKED_ONCE_SHARE * 2 * hint(out.shape[-2]) else set()


def _undone(n: Node, graph: Graph, inside: set[str]) -> bool:
    """`n` (a PERMUTE) is undone by the permute it reads or by every in-group permute reading it
    (a transpose of a transpose: the schedule reads the composition, which is the identity)."""

    def inverse(p: Node, q: Node) -> bool:  # permute(permute(x, p), q) is x
        pp, qp = p.attrs["perm"], q.attrs["perm"]
        return len(pp) == len(qp) and all(pp[qp[i]] == i for i in range(len(qp)))

    src = graph[n.inputs[0]]
    if src.name in inside and src.op is Op.PERMUTE and inverse(src, n):
        return True
    users = [graph[u] for u in graph.users(n.name) if u in inside]
    return bool(users) and all(u.op is Op.PERMUTE and inverse(n, u) for u in users)


def _descendants(name: str, inside: set[str], graph: Graph) -> set[str]:
    seen: set[str] = set()
    stack = [u for u in graph.users(name) if u in inside]
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack.extend(u for u in graph.users(v) if u in inside)
    return seen
