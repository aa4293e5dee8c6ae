"""Common-subexpression elimination over pure ops (same op, inputs and attributes)."""

from __future__ import annotations

from vfuse.ir import Graph, Node, opdef
from vfuse.passes.rebuild import rebuild


def cse(graph: Graph) -> Graph:
    seen: dict[tuple, str] = {}

    def decide(node: Node) -> Node | str:
        if not opdef(node.op).pure:  # two identical-looking instances are still different values
            return node
        key = (node.op, node.inputs, node.attrs, node.type)
        if key in seen:
            return seen[key]
        seen[key] = node.name
        return node

    return rebuild(graph, decide)
