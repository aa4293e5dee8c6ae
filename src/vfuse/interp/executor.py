"""Op-by-op execution of an IR graph with each op's `OpDef.ref`.

This is the semantics every generated kernel is tested against, and the backend of last
resort: anything the code generators cannot handle still runs correctly here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vfuse.errors import VfuseError, VfuseIndexError, VfuseZeroDivisionError
from vfuse.ir import Graph, Node, Op, TensorType, opdef


class ExecutionError(RuntimeError):
    """A node failed while running; the message names the node, its op and its FX origin."""


def _where(node: Node) -> str:
    origin = f" from FX node '{node.origin}'" if node.origin else ""
    return f"%{node.name} = {node.op.value}(...){origin}"


def located(node: Node, fault: VfuseIndexError | VfuseZeroDivisionError) -> VfuseError:
    """`fault` (what eager torch raises too: an index out of range, an integer division by
    zero) as the same exception type, its message naming the node; native kernels say the same."""
    return type(fault)(f"{_where(node)}: {fault}")


def run_node(node: Node, args: Sequence[Any]) -> Any:
    """Evaluate one non-INPUT node on already computed argument values."""
    try:
        out = opdef(node.op).ref(*args, node.attrs)
    except (VfuseIndexError, VfuseZeroDivisionError) as e:
        raise located(node, e) from None
    except Exception as e:
        raise ExecutionError(f"{_where(node)} failed: {e}") from e
    if isinstance(node.type, TensorType) and isinstance(out, torch.Tensor):
        # The reference may return views or promote; the IR type is the contract.
        want = node.type.dtype.torch
        if out.dtype != want:
            out = out.to(want)
    return out


def run(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[Any]:
    """Run `graph` on `inputs` (positional, as its INPUT nodes' indices) and return its outputs."""
    values: dict[str, Any] = {}
    remaining = {n.name: len(graph.users(n.name)) for n in graph.nodes}
    keep = set(graph.outputs)
    for node in graph.nodes:
        if node.op is Op.INPUT:
            values[node.name] = inputs[node.attrs["index"]]
            continue
        values[node.name] = run_node(node, [values[i] for i in node.inputs])
        for i in dict.fromkeys(node.inputs):
            # Free intermediates as soon as their last user ran, like a real executor would.
            remaining[i] -= 1
            if remaining[i] == 0 and i not in keep:
                del values[i]
    return [values[o] for o in graph.outputs]
