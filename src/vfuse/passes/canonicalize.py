"""Canonicalization: remove ops that do nothing, so the planner and the report see real work.

Identity reshapes/permutes/expands/casts/slices and arithmetic identities (x + 0, x * 1,
x - 0, x / 1) are replaced by their input when the result type is exactly the input's type
(so no broadcast or promotion is hidden).
"""

from __future__ import annotations

from vfuse.ir import Graph, Node, Op
from vfuse.passes.rebuild import rebuild

_IDENTITY_ELEMENT = {Op.ADD: (0, True), Op.SUB: (0, False), Op.MUL: (1, True), Op.DIV: (1, False)}


def _is_full(graph: Graph, name: str, value: float) -> bool:
    node = graph[name]
    return node.op is Op.FULL and node.attrs["value"] == value


def _identity_of(graph: Graph, node: Node) -> str | None:
    """The input this node merely passes through, if any."""
    if node.op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.CAST, Op.SLICE):
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


def canonicalize(graph: Graph) -> Graph:
    def decide(node: Node) -> Node | str:
        # Inputs are already renamed; look them up in the source graph, whose types match.
        return _identity_of(graph, node) or node

    return rebuild(graph, decide)
