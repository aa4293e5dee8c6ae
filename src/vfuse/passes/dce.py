"""Dead-code elimination: drop nodes no output depends on (graph inputs always stay)."""

from __future__ import annotations

from vfuse.ir import Graph, Node, Op
from vfuse.passes.rebuild import rebuild


def dce(graph: Graph) -> Graph:
    live = set(graph.outputs)
    for node in reversed(graph.nodes):
        if node.name in live:
            live.update(node.inputs)

    def decide(node: Node) -> Node | None:
        return node if node.name in live or node.op is Op.INPUT else None

    return rebuild(graph, decide)
