"""The attention backward stores its stacked gradients in the order their reader wants.

AOTAutograd's backward of a fused qkv projection reads SDPA_BACKWARD's stacked [3, B, H, L, D]
output through PERMUTE (1, 3, 0, 2, 4) as [B, L, 3, H, D], the projection's layout: the weight
gradient's GEMM packs it through that permutation and the bias gradient sums it, column by column,
with its rows 64 floats apart (the sum measured 1.5 ms against 0.08 ms for torch's contiguous
sum on Zen 3). When that PERMUTE (head size kept innermost) is the stacked output's only reader,
the op takes it as its `perm` attribute and stores its gradients' rows at the permuted places
(ir/defs/attention_grad.py): the PERMUTE's readers then read the op's contiguous output. RESHAPEs
that follow it as its only reader fold too (attr `shape`): a template without an epilogue would
otherwise get them as a copy kernel of its output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from vfuse.ir import Graph, Node, Op
from vfuse.ir.sym import is_sym
from vfuse.passes.rebuild import rebuild


def _folds(graph: Graph, node: Node, readers: Counter[str]) -> bool:
    """`node` is a PERMUTE (last axis kept) of a stacked SDPA_BACKWARD that nothing else reads."""
    if node.op is not Op.PERMUTE:
        return False
    src = graph[node.inputs[0]]
    perm = tuple(node.attrs["perm"])
    return (
        src.op is Op.SDPA_BACKWARD
        and src.attrs.get("stacked", False)
        and src.attrs.get("perm") is None
        and readers[src.name] == 1
        and src.name not in graph.outputs
        and perm[-1] == len(perm) - 1
        and not any(is_sym(d) for d in src.tensor_type.shape)  # the template's strides are constants
    )


def _chain(graph: Graph, perm: str, readers: dict[str, list[str]]) -> list[str]:
    """`perm` and the RESHAPEs that follow it, each the only reader of the one before."""
    chain = [perm]
    while len(readers.get(chain[-1], ())) == 1 and chain[-1] not in graph.outputs:
        nxt = graph[readers[chain[-1]][0]]
        if nxt.op is not Op.RESHAPE:
            break
        chain.append(nxt.name)
    return chain


def store_grads_permuted(graph: Graph) -> Graph:
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n.name)
    counts = Counter({k: len(v) for k, v in readers.items()})
    chains = [[n.inputs[0], *_chain(graph, n.name, readers)] for n in graph.nodes if _folds(graph, n, counts)]
    if not chains:
        return graph
    # The last node of a chain (SDPA_BACKWARD, PERMUTE, RESHAPE...) becomes the op; the others go.
    last = {c[-1]: c for c in chains}
    dropped = {name for c in chains for name in c[:-1]}

    def decide(node: Node) -> Node | None:
        if node.name in last:
            src, perm, *views = (graph[x] for x in last[node.name])
            attrs = src.attrs.replace(perm=tuple(perm.attrs["perm"]))
            if views:
                attrs = attrs.replace(shape=tuple(node.tensor_type.shape))
            return replace(src, name=node.name, attrs=attrs, type=node.type)
        return None if node.name in dropped else node

    return rebuild(graph, decide)
