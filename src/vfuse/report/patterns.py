"""A kernel's pattern in the words of the model it came from: "LayerNorm row kernel",
"Linear+GELU GEMM epilogue", "attention", "softmax row kernel", "pointwise chain (gelu > add)".

Read off the kernel's ops and the classes of the modules its nodes came from (`modules.py`); a
name only describes, it never decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from vfuse.ir import Graph, Kind, Node, Op, opdef
from vfuse.report.modules import Source
from vfuse.report.units import op_label

ACTIVATIONS = {
    Op.GELU: "GELU",
    Op.RELU: "ReLU",
    Op.SILU: "SiLU",
    Op.SIGMOID: "Sigmoid",
    Op.TANH: "Tanh",
    Op.ERF: "erf",
}
CONTRACTIONS = {
    Op.MATMUL: "GEMM",
    Op.CONV2D: "conv",
    Op.SDPA: "attention",
    Op.SDPA_LSE: "attention (with logsumexp)",
    Op.SDPA_BACKWARD: "attention backward",
    Op.SCATTER_ADD: "scatter-add",
}
CHAIN_LIMIT = 4  # ops named in a pointwise chain before "…"


def pattern_of(graph: Graph, nodes: Sequence[str], sources: Mapping[str, Source], torch: bool = False) -> str:
    """The pattern `nodes` (one kernel's, in order) form; `torch`: they run through torch."""
    ns = [graph[n] for n in nodes]
    if torch:
        named = [n for n in ns if n.op is not Op.GET_ITEM and not opdef(n.op).layout_only] or ns
        return "torch: " + _distinct(_short(n) for n in named)
    contraction = next((n for n in ns if n.kind is Kind.CONTRACTION), None)
    if contraction is not None:
        return _contraction(graph, contraction, ns, sources)
    reduces = [n for n in ns if n.kind is Kind.REDUCE]
    if reduces:
        return _row(reduces[0], {n.op for n in ns}, sources)
    compute = [n for n in ns if not opdef(n.op).layout_only and n.op is not Op.FULL]  # FULL: a constant
    if not compute:
        return "layout copy"
    return f"pointwise chain ({_distinct((n.op.value for n in compute), ' > ')})"


def _contraction(graph: Graph, node: Node, ns: list[Node], sources: Mapping[str, Source]) -> str:
    word = CONTRACTIONS[node.op]
    if node.op in (Op.SDPA, Op.SDPA_LSE, Op.SDPA_BACKWARD, Op.SCATTER_ADD):
        return word
    owner = sources.get(node.name)
    head = owner.cls if owner is not None and owner.cls in ("Linear", "Conv1d", "Conv2d") else node.op.value
    before = _ancestors(graph, node.name, {n.name for n in ns})
    after = [n for n in ns if n is not node and n.name not in before and not opdef(n.op).layout_only]
    parts = [p for p in (_epilogue_part(n, owner, sources) for n in after) if p]
    name = "+".join(dict.fromkeys([head, *parts])) + f" {word}" + (" epilogue" if parts else "")
    if any(not opdef(graph[n].op).layout_only for n in before):
        name += " with operand prologue"
    return name


def _epilogue_part(n: Node, owner: Source | None, sources: Mapping[str, Source]) -> str | None:
    """How an epilogue op reads in a pattern: an activation by name, an op of another layer by
    the layer's class (BatchNorm2d), a container's op (a residual add) by the op; the
    contraction's own module's ops (nn.Linear's bias add) not at all."""
    if n.op in ACTIVATIONS:
        return ACTIVATIONS[n.op]
    src = sources.get(n.name)
    if src is None or owner is None:
        return n.op.value
    if src.module == owner.module:
        return None
    if src.module == "" or owner.module.startswith(src.module + "."):
        return n.op.value
    return src.cls


def _ancestors(graph: Graph, name: str, inside: set[str]) -> set[str]:
    """The nodes among `inside` that `name` depends on."""
    seen: set[str] = set()
    stack = [i for i in graph[name].inputs if i in inside]
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack += [i for i in graph[v].inputs if i in inside]
    return seen


def _row(first: Node, ops: set[Op], sources: Mapping[str, Source]) -> str:
    owner = sources.get(first.name)
    if owner is not None and "Norm" in owner.cls:
        return f"{owner.cls} row kernel"
    if {Op.AMAX, Op.EXP, Op.SUM} <= ops:
        return ("log-softmax" if Op.LOG in ops else "softmax") + " row kernel"
    if {Op.SUM, Op.RSQRT} <= ops:
        return "normalization row kernel"
    reduces = _distinct(op.value for op in sorted(ops, key=lambda o: o.value) if opdef(op).kind is Kind.REDUCE)
    return f"row kernel ({reduces})"


def _short(node: Node) -> str:
    """A torch fallback by the torch op it calls ("aten.max_pool2d"), else the op name."""
    label = op_label(node)
    return label.removeprefix("opaque:").removesuffix(".default")


def _distinct(names: Iterable[str], sep: str = ", ") -> str:
    seen = list(dict.fromkeys(names))
    shown = sep.join(seen[:CHAIN_LIMIT])
    return shown + (sep + "…" if len(seen) > CHAIN_LIMIT else "")
