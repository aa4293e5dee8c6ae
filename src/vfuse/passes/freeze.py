"""Freezing: turn graph inputs that hold parameters into CONSTANT nodes.

Folding (Conv-BN) and constant evaluation need the values of weights, which capture lifts to
inputs. With `freeze=True` the caller names which inputs are parameters and passes their live
tensors; the compiled graph then reads them as constants and no longer takes them as inputs.
A frozen graph does not see later in-place updates of those parameters (as with Inductor's freezing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from vfuse.ir import Attrs, ConstValue, Graph, Node, Op, TensorType
from vfuse.passes.rebuild import rebuild


def freeze_inputs(graph: Graph, values: Mapping[int, torch.Tensor]) -> Graph:
    """Replace INPUT nodes whose index is in `values` by constants; renumber the other inputs."""
    kept = sorted(n.attrs["index"] for n in graph.inputs if n.attrs["index"] not in values)
    new_index = {old: new for new, old in enumerate(kept)}

    def decide(node: Node) -> Node:
        if node.op is not Op.INPUT:
            return node
        index = node.attrs["index"]
        if index not in values:
            return replace(node, attrs=node.attrs.replace(index=new_index[index]))
        tensor = values[index].detach()
        if TensorType.of(tensor) != node.type:
            raise ValueError(f"cannot freeze %{node.name}: value is {TensorType.of(tensor)}, input is {node.type}")
        return replace(node, op=Op.CONSTANT, attrs=Attrs.of(value=ConstValue(tensor)))

    return rebuild(graph, decide)
