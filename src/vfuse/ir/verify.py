"""`verify(graph)`: SSA, topological order, arity, attributes and types; run after every pass in tests."""

from __future__ import annotations

from vfuse.ir.graph import Graph
from vfuse.ir.opdefs import opdef
from vfuse.ir.ops import Op


class IRError(ValueError):
    """The graph breaks an IR invariant; the message names the node."""


def verify(graph: Graph) -> Graph:
    """Raise IRError on the first broken invariant; return the graph for chaining."""
    seen: set[str] = set()
    input_indices: list[int] = []
    for node in graph.nodes:
        where = f"node %{node.name} ({node.op.value})"
        if node.name in seen:
            raise IRError(f"{where}: value defined twice")
        d = opdef(node.op)
        if d.arity is not None and len(node.inputs) != d.arity:
            raise IRError(f"{where}: expects {d.arity} inputs, has {len(node.inputs)}")
        for i in node.inputs:
            if i not in seen:
                raise IRError(f"{where}: input %{i} is not defined before use")
        missing = [a for a in d.attrs if a not in node.attrs]
        if missing:
            raise IRError(f"{where}: missing attributes {missing}")
        try:
            expected = d.infer(tuple(graph[i].type for i in node.inputs), node.attrs)  # type: ignore[arg-type]
        except Exception as e:
            raise IRError(f"{where}: type rule fails: {e}") from e
        if expected != node.type:
            raise IRError(f"{where}: type is {node.type}, its rule gives {expected}")
        if node.op is Op.INPUT:
            input_indices.append(node.attrs["index"])
        seen.add(node.name)
    # Indices are argument positions: size arguments of a graph with symbolic sizes (ir/sym.py)
    # hold positions without an INPUT node, so there may be gaps, never repeats.
    if len(set(input_indices)) != len(input_indices) or min(input_indices, default=0) < 0:
        raise IRError(f"input indices {sorted(input_indices)} repeat or are not argument positions")
    for o in graph.outputs:
        if o not in seen:
            raise IRError(f"output %{o} is not defined")
    return graph
