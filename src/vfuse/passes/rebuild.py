"""The one mechanism passes use to produce a new graph: copy nodes with inputs renamed.

A pass decides, per node, to keep it, drop it, or alias it to another value; `rebuild`
applies those decisions in one pass over the topological order and returns a new Graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from vfuse.ir import Graph, Node

# Given a node whose inputs are already renamed, return the node to keep, or a str naming an
# existing value that replaces it (an alias), or None to drop it, or a tuple of new nodes
# ending in the one that takes the node's place (the others are new values it reads).
Decide = Callable[[Node], "Node | str | tuple[Node, ...] | None"]


def rebuild(graph: Graph, decide: Decide) -> Graph:
    alias: dict[str, str] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        renamed = node.inputs and tuple(alias.get(i, i) for i in node.inputs)
        if renamed and renamed != node.inputs:
            node = replace(node, inputs=renamed)
        verdict = decide(node)
        if isinstance(verdict, str):
            alias[node.name] = alias.get(verdict, verdict)
        elif isinstance(verdict, tuple):
            nodes.extend(verdict)
        elif verdict is not None:
            nodes.append(verdict)
    outputs = tuple(alias.get(o, o) for o in graph.outputs)
    return Graph(tuple(nodes), outputs)
