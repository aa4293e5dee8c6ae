"""A conv the cost model sends to torch's library whose weight the group computes by layout ops.

convolution_backward's data gradient is a conv2d of the weight with its channels swapped and its
taps flipped (`frontend/lower_conv_backward.py`): a permute and a CAT of kh*kw unit slices. The
template computes that while packing; through torch, the torch step ran the CAT op by op (a
2x256x8x8 data gradient with a 256x256x3x3 weight, one thread, Zen 3: the CAT 1.24 ms, the conv
2.1 ms). Here such a weight is stored first by a native pointwise kernel (one strided copy,
~0.1 ms), and the torch step runs the conv alone on that contiguous buffer.
"""

from __future__ import annotations

from vfuse.ir import Graph, Kind, Op


def _producers(graph: Graph, value: str, members: set[str]) -> set[str] | None:
    """`value` and its in-group producers, or None unless every one of them is a layout op."""
    seen: set[str] = set()
    stack = [value]
    while stack:
        n = stack.pop()
        if n in seen or n not in members:
            continue
        if graph[n].kind is not Kind.INJECTIVE:
            return None
        seen.add(n)
        stack += graph[n].inputs
    return seen


def staged_weights(graph: Graph, members: set[str], torch_nodes: list[str]) -> tuple[list[str], list[str]]:
    """(the conv weights of `torch_nodes` a native kernel should store before the torch step,
    the torch step's nodes without their producers). Only weights computed in the group (not a
    group input) from layout ops only, with a copy among them (a CAT: a plain view costs torch
    nothing but conv2d's own contiguous copy)."""
    staged: list[str] = []
    for n in torch_nodes:
        node = graph[n]
        if node.op is not Op.CONV2D or node.inputs[1] not in members:
            continue
        chain = _producers(graph, node.inputs[1], members)
        if chain is None or not any(graph[p].op is Op.CAT for p in chain):
            continue
        staged.append(node.inputs[1])
    if not staged:
        return [], torch_nodes
    # The torch step keeps what its contractions still need past the staged weights.
    keep: set[str] = set()
    stack = [n for n in torch_nodes if graph[n].kind in (Kind.CONTRACTION, Kind.OPAQUE)]
    while stack:
        n = stack.pop()
        if n in keep or n not in members or n in staged:
            continue
        keep.add(n)
        stack += graph[n].inputs
    return staged, [n for n in torch_nodes if n in keep]
