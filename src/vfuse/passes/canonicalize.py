"""Canonicalization: remove ops that do nothing, so the planner and the report see real work.

Identity reshapes/permutes/expands/casts/slices and arithmetic identities (x + 0, x * 1,
x - 0, x / 1) are replaced by their input when the result type is exactly the input's type
(so no broadcast or promotion is hidden). Powers 2, 3 and 0.5 become multiplies and a sqrt.
"""

from __future__ import annotations

from dataclasses import replace

from vfuse.ir import Graph, Node, Op
from vfuse.ir.sym import is_sym
from vfuse.passes.rebuild import rebuild

_IDENTITY_ELEMENT = {Op.ADD: (0, True), Op.SUB: (0, False), Op.MUL: (1, True), Op.DIV: (1, False)}


def _is_full(graph: Graph, name: str, value: float) -> bool:
    node = graph[name]
    # A symbolic size as the value is never taken for a constant: x / (n - 1) stays a division.
    return node.op is Op.FULL and not is_sym(node.attrs["value"]) and node.attrs["value"] == value


def _identity_of(graph: Graph, node: Node) -> str | None:
    """The input this node merely passes through, if any."""
    if node.op is Op.PERMUTE:
        # A permutation of equal sizes (a square transpose) keeps the type but moves data.
        identity = node.attrs["perm"] == tuple(range(len(node.attrs["perm"])))
        return node.inputs[0] if identity else None
    if node.op in (Op.RESHAPE, Op.EXPAND, Op.CAST, Op.SLICE):
        # Same type means same sizes: for these ops that can only be the identity map.
        src = node.inputs[0]
        return src if graph[src].type == node.type else None
    if node.op in _IDENTITY_ELEMENT:
        value, commutes = _IDENTITY_ELEMENT[node.op]
        a, b = node.inputs
        if _is_full(graph, b, value) and graph[a].type == node.type:
            return a
        if commutes and _is_full(graph, a, value) and graph[b].type == node.type:
            return b
    return None


def _strength_reduced(graph: Graph, node: Node) -> Node | tuple[Node, ...]:
    """x ** 2 -> x * x, x ** 3 -> (x * x) * x and x ** 0.5 -> sqrt(x): far cheaper than a general
    pow, and what eager computes for these exponents (ATen's pow_tensor_scalar_optimized_kernel),
    bit for bit (HF's GPT-2 GELU is torch.pow(x, 3.0))."""
    if node.op is Op.POW and graph[node.inputs[0]].type == node.type:
        x, e = node.inputs
        if _is_full(graph, e, 2.0):
            return replace(node, op=Op.MUL, inputs=(x, x))
        if _is_full(graph, e, 3.0):
            square = replace(node, name=_fresh(graph, f"{node.name}_sq"), op=Op.MUL, inputs=(x, x))
            return square, replace(node, op=Op.MUL, inputs=(square.name, x))
        if _is_full(graph, e, 0.5) and node.tensor_type.dtype.is_float:
            return replace(node, op=Op.SQRT, inputs=(x,))
    return node


def _fresh(graph: Graph, name: str) -> str:
    while name in graph:
        name += "_"
    return name


def canonicalize(graph: Graph) -> Graph:
    def decide(node: Node) -> Node | str | tuple[Node, ...]:
        # Inputs are already renamed; look them up in the source graph, whose types match.
        return _identity_of(graph, node) or _strength_reduced(graph, node)

    return rebuild(graph, decide)
