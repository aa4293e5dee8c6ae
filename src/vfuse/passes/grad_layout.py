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

Separate q, k, v projections (BERT) read the stack instead through one SLICE per gradient, each
reshaped to [B, H, L, D] and permuted to [B, L, H, D] for its linear's backward: the bias sum and
the weight-gradient GEMM then read rows 64 floats apart (6 x 150 us per BERT step on Zen 3 for a
transposed copy and a strided column sum). When every reader of the stack is such a chain with
the same permutation, the op stores the stack in that order (`perm` (0, 1 + P...)) and each
chain's PERMUTE becomes a RESHAPE of its slice (`_sliced`).
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


def _only_reader(graph: Graph, name: str, readers: dict[str, list[str]], op: Op) -> Node | None:
    """The one node reading `name`, when it is an `op` and `name` is not a graph output."""
    mine = readers.get(name, [])
    if len(mine) != 1 or name in graph.outputs or graph[mine[0]].op is not op:
        return None
    return graph[mine[0]]


def _sliced(graph: Graph, src: Node, readers: dict[str, list[str]]) -> tuple[tuple[int, ...], list[Node]] | None:
    """(the stack's permutation, its readers' chains' nodes) when `src` is a stacked SDPA_BACKWARD
    read only through SLICE (one entry of the stack) -> RESHAPE (dropping that axis) -> PERMUTE,
    each the only reader of the one before, all with one permutation P keeping the last axis last."""
    shape = src.tensor_type.shape
    if not src.attrs.get("stacked", False) or src.attrs.get("perm") is not None or src.name in graph.outputs:
        return None
    if any(is_sym(d) for d in shape) or not readers.get(src.name):
        return None
    perms, chain = set(), []
    for name in readers[src.name]:
        sl = graph[name]
        a = sl.attrs
        if sl.op is not Op.SLICE or (a["dim"], a["step"], a["end"] - a["start"]) != (0, 1, 1):
            return None
        view = _only_reader(graph, name, readers, Op.RESHAPE)
        if view is None or view.tensor_type.shape != shape[1:]:
            return None
        perm = _only_reader(graph, view.name, readers, Op.PERMUTE)
        if perm is None:
            return None
        perms.add(tuple(perm.attrs["perm"]))
        chain += [sl, view, perm]
    (p,) = perms if len(perms) == 1 else (None,)
    if p is None or p[-1] != len(p) - 1 or p == tuple(range(len(p))):
        return None
    return (0, *(i + 1 for i in p)), chain


def _store_sliced(graph: Graph, readers: dict[str, list[str]]) -> Graph:
    """Every stack read through sliced chains (`_sliced`) stored in their order."""
    found = {n.name: f for n in graph.nodes if n.op is Op.SDPA_BACKWARD and (f := _sliced(graph, n, readers))}
    if not found:
        return graph
    perm_of = {n.name: p for p, chain in found.values() for n in chain} | {k: p for k, (p, _) in found.items()}
    views = {n.name: n for _, chain in found.values() for n in chain if n.op is Op.RESHAPE}

    def decide(node: Node) -> Node | None:
        if node.name not in perm_of:
            return node
        perm, shape = perm_of[node.name], node.tensor_type.shape
        if node.op is Op.SDPA_BACKWARD:
            permuted = tuple(shape[i] for i in perm)
            return replace(node, attrs=node.attrs.replace(perm=perm), type=replace(node.tensor_type, shape=permuted))
        if node.op is Op.SLICE:  # [1, B, H, L, D] -> [1, B, L, H, D]
            return replace(node, type=replace(node.tensor_type, shape=tuple(shape[i] for i in perm)))
        if node.op is Op.RESHAPE:
            return None  # the PERMUTE after it takes its place
        view = views[node.inputs[0]]  # PERMUTE -> RESHAPE of the slice, now already in P's order
        return replace(view, name=node.name, attrs=view.attrs.replace(shape=shape), type=node.type)

    return rebuild(graph, decide)


def _readers(graph: Graph) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n.name)
    return readers


def store_grads_permuted(graph: Graph) -> Graph:
    graph = _store_sliced(graph, _readers(graph))  # stacks read through slices: perm set, not folded below
    readers = _readers(graph)
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
