"""Common-subexpression elimination over pure ops (same op, inputs and attributes)."""

from __future__ import annotations

from vfuse.ir import Graph, Kind, Node, Op
from vfuse.passes.rebuild import rebuild

# Ops whose two identical-looking instances are still different values.
_IMPURE = {Op.INPUT, Op.RNG_SEED, Op.RAND, Op.OPAQUE, Op.GET_ITEM}


def cse(graph: Graph) -> Graph:
    seen: dict[tuple, str] = {}

    def decide(node: Node) -> Node | str:
        if node.op in _IMPURE or node.kind is Kind.OPAQUE:
            return node
        key = (node.op, node.inputs, node.attrs, node.type)
        if key in seen:
            return seen[key]
        seen[key] = node.name
        return node

    return rebuild(graph, decide)
