"""Readable, stable text form of a Graph (used by dumps, the report and golden tests).

    graph(%x: f32[4,8], %w: f32[8,8]) {
      %mm = matmul(%x, %w) : f32[4,8]
      %sum = sum(%mm) {axes=(1,), keepdim=True} : f32[4,1]
      return (%sum)
    }

`canonical=True` renames values %0, %1, ... in order so goldens do not depend on FX names.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from vfuse.ir.ops import ConstValue, Op
from vfuse.ir.types import DType

if TYPE_CHECKING:  # the graph prints itself with this module
    from vfuse.ir.graph import Graph, Node


def format_value(v: Any) -> str:
    if isinstance(v, DType):
        return v.value
    if isinstance(v, enum.Enum):
        return v.name.lower()
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, ConstValue):
        return str(v)
    if isinstance(v, tuple):
        inner = ", ".join(format_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    return str(v)


def format_node(node: Node, rename: dict[str, str] | None = None) -> str:
    r = rename or {}
    args = ", ".join(f"%{r.get(i, i)}" for i in node.inputs)
    shown = {k: v for k, v in node.attrs.items() if not (node.op is Op.OPAQUE and k == "out_type")}
    attrs = ", ".join(f"{k}={format_value(v)}" for k, v in shown.items())
    attrs = f" {{{attrs}}}" if attrs else ""
    return f"%{r.get(node.name, node.name)} = {node.op.value}({args}){attrs} : {node.type}"


def format_graph(graph: Graph, canonical: bool = False) -> str:
    rename = {n.name: str(i) for i, n in enumerate(graph.nodes)} if canonical else {}
    params = ", ".join(f"%{rename.get(n.name, n.name)}: {n.type}" for n in graph.inputs)
    lines = [f"graph({params}) {{"]
    lines += ["  " + format_node(n, rename) for n in graph.nodes if n.op is not Op.INPUT]
    outs = ", ".join(f"%{rename.get(o, o)}" for o in graph.outputs)
    lines += [f"  return ({outs})", "}"]
    return "\n".join(lines)
