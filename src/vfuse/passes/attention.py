"""Attention rewrite: a hand-written attention chain -> one SDPA node.

Recognised by dataflow from the MATMUL with V backwards, not by enumerating spellings:

    pv     = MATMUL(P', V')          P', V' are batch-only views (reshape/identity expand) of P, V
    P      = DIV(E, SUM(E)) | MUL(E, RECIPROCAL(SUM(E)))     softmax over the last axis,
    E      = EXP(Z - AMAX(Z)) | EXP(Z)                       with or without the max shift
    Z      = scores after any chain of: MUL/DIV by a positive scalar, ADD of a float mask,
             WHERE(mask, fill, s) / WHERE(mask, s, fill) with fill -inf or a huge negative value,
             batch-only RESHAPE (how torch.matmul decomposes into 3-D bmm)
    scores = MATMUL(Q', K')          K' is any value: K = K' with its last two axes swapped
                                     (folded into a PERMUTE producing K' when there is one)

Scalar factors on Q or K (scale-before-matmul) join the scale. K/V built by repeat_kv
(RESHAPE -> EXPAND of a size-1 head-group axis -> RESHAPE) become gqa=True on the un-expanded
K/V. A mask that folds to a constant top-left causal pattern (tril of ones, IOTA compares, a
-inf/finfo.min triu buffer) becomes causal=True when it is the only mask; several masks are
summed into one additive mask. The chain is rewritten only when every intermediate (scores,
probabilities, softmax pieces) has no user outside it and is not a graph output. Training-mode
dropout on P (RAND/GE/MUL between softmax and the PV matmul, after torch's "safe softmax" WHERE)
is matched only with `dropout=True` (backend="triton"): the SDPA then carries the rate, the
RAND's stream and its seed, so its mask has the decomposed chain's bits.

Half precision: a softmax computed in fp32 between CASTs (HF's softmax(..., dtype=float32)
.to(q.dtype)) is matched too; the SDPA then runs in the model's dtype, like eager SDPA would.

Exactness: fills of -inf become a boolean keep-mask; fills <= -1e30 or == finfo(dtype).min
become an additive mask (s + fill rounds to fill, so even fully masked rows match). Moderate
fills (-1e4, -1e9) are not rewritten: for fully masked rows they would differ from eager.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import torch

from vfuse.ir import DType, Graph, GraphBuilder, Node, Op
from vfuse.passes.dce import dce
from vfuse.passes.fold_bn import constant_value  # compile-time evaluation of constant subgraphs

_HUGE_NEGATIVE = -1e30


@dataclass(frozen=True)
class _Mask:
    """One mask applied to the scores. kind: 'add' (float, times factor), 'keep' (bool, -inf
    fill), 'fill' (bool, huge negative fill). `negate`: the condition marks masked positions."""

    kind: str
    value: str
    negate: bool = False
    factor: float = 1.0
    fill: float = 0.0


@dataclass(frozen=True)
class _Dropout:
    """Dropout on P: kept where RAND(seed; stream) >= rate, scaled by 1 / (1 - rate)."""

    seed: str
    rate: float
    stream: int


@dataclass(frozen=True)
class _Match:
    """Everything needed to emit the SDPA for one attention chain ending at MATMUL `pv`."""

    pv: str
    chain: frozenset[str]
    q: str
    k: str
    k_perm: tuple[int, ...] | None  # PERMUTE to apply to `k` to get [..., Lk, D]
    v: str
    batch: tuple[int, ...]  # the batch shape of the softmax (the SDPA's batch shape)
    scale: float
    masks: tuple[_Mask, ...]
    causal: bool
    dropout: _Dropout | None = None


# -- reading the graph ----------------------------------------------------------------------


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    return graph[name].tensor_type.shape


def _scalar(graph: Graph, name: str) -> float | None:
    """The value of a one-element FULL or CONSTANT, else None."""
    node = graph[name]
    if node.op is Op.FULL and math.prod(node.attrs["shape"]) == 1:
        return float(node.attrs["value"])
    if node.op is Op.CONSTANT and node.attrs["value"].tensor.numel() == 1:
        return float(node.attrs["value"].tensor.item())
    return None


def _is_batch_view(graph: Graph, node: Node) -> bool:
    """A RESHAPE keeping the last two axes, or an EXPAND that changes nothing."""
    if node.op not in (Op.RESHAPE, Op.EXPAND):
        return False
    src, out = _shape(graph, node.inputs[0]), node.tensor_type.shape
    if node.op is Op.EXPAND:
        return src == out
    return len(src) >= 2 and len(out) >= 2 and src[-2:] == out[-2:]


def _peel(graph: Graph, name: str, scale: float | None = 1.0) -> tuple[str, float, list[str]]:
    """Walk up batch-only views and (unless scale is None) positive scalar MUL/DIV:
    (base, accumulated scale, nodes walked)."""
    walked: list[str] = []
    while True:
        node = graph[name]
        if _is_batch_view(graph, node):
            walked.append(name)
            name = node.inputs[0]
            continue
        factor = None if scale is None else _scale_factor(graph, node)
        if factor is None:
            return name, 1.0 if scale is None else scale, walked
        walked.append(name)
        scale *= factor[1]  # type: ignore[operator]
        name = factor[0]


def _scale_factor(graph: Graph, node: Node) -> tuple[str, float] | None:
    """(other operand, factor) when `node` multiplies or divides by a positive finite scalar."""
    if node.op not in (Op.MUL, Op.DIV) or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    sides = [(a, _scalar(graph, b))] + ([(b, _scalar(graph, a))] if node.op is Op.MUL else [])
    for other, c in sides:
        if c is not None and 0 < c < math.inf and _shape(graph, other) == node.tensor_type.shape:
            return other, (c if node.op is Op.MUL else 1.0 / c)
    return None


def _huge_negative(value: float, dtype: DType) -> bool:
    return value <= _HUGE_NEGATIVE or value == torch.finfo(dtype.torch).min


def _where_mask(graph: Graph, node: Node) -> tuple[str, _Mask] | None:
    """(scores side, mask) for WHERE(c, s, fill) or WHERE(c, fill, s) with a masking fill."""
    cond, a, b = node.inputs
    if not node.tensor_type.dtype.is_float:
        return None
    for scores, fill, negate in ((a, b, False), (b, a, True)):
        value = _full_value(graph, fill)
        if value is None or _shape(graph, scores) != node.tensor_type.shape:
            continue
        if value == -math.inf:
            return scores, _Mask("keep", cond, negate)
        if _huge_negative(value, node.tensor_type.dtype):
            return scores, _Mask("fill", cond, negate, fill=value)
    return None


def _full_value(graph: Graph, name: str) -> float | None:
    node = graph[name]
    return float(node.attrs["value"]) if node.op is Op.FULL else _scalar(graph, name)


def _score_inputs(graph: Graph, node: Node) -> list[str]:
    """Inputs of `node` that may carry the scores through a scale / mask / view step."""
    if node.op in (Op.MUL, Op.DIV):
        factor = _scale_factor(graph, node)
        return [factor[0]] if factor else []
    if node.op is Op.RESHAPE and _is_batch_view(graph, node):
        return [node.inputs[0]]
    if _float_cast(graph, node):  # a half-precision scale computed at fp32 (eager's opmath)
        return [node.inputs[0]]
    if node.op is Op.ADD and node.tensor_type.dtype.is_float:
        return [i for i in node.inputs if graph[i].type == node.type]
    if node.op is Op.WHERE:
        found = _where_mask(graph, node)
        return [found[0]] if found else []
    return []


def _score_path(graph: Graph, name: str, depth: int = 0) -> list[str] | None:
    """Value names from the QK MATMUL to `name`, if `name` is scores after scale/mask steps."""
    node = graph[name]
    if node.op is Op.MATMUL:
        return [name]
    if depth > 32:
        return None
    for prev in _score_inputs(graph, node):
        path = _score_path(graph, prev, depth + 1)
        if path is not None:
            return [*path, name]
    return None


def _fold_scores(graph: Graph, path: list[str]) -> tuple[float, tuple[_Mask, ...]] | None:
    """Fold the steps after the QK matmul into Z = scores * scale + masks (masks last)."""
    scale, masks = 1.0, []
    for prev, name in itertools.pairwise(path):
        node = graph[name]
        if node.op is Op.RESHAPE:
            if masks:  # a mask applied in another batch layout than the softmax's
                return None
        elif node.op in (Op.MUL, Op.DIV):
            c = _scale_factor(graph, node)[1]  # type: ignore[index]
            scale *= c
            # (s + m) * c = s * c + m * c; a -inf keep-mask is unchanged by c > 0
            masks = [replace(m, factor=m.factor * c) if m.kind != "keep" else m for m in masks]
        elif node.op is Op.CAST:
            continue
        elif node.op is Op.ADD:
            other = node.inputs[1] if node.inputs[0] == prev else node.inputs[0]
            masks.append(_Mask("add", other))
        else:
            masks.append(_where_mask(graph, node)[1])  # type: ignore[index]
    return scale, tuple(masks)


def _softmax_input(graph: Graph, p: str) -> tuple[str, list[str]] | None:
    """(Z, softmax nodes) when `p` is softmax(Z) over the last axis in decomposed form."""
    node = graph[p]
    if node.op is Op.DIV:
        e, s = node.inputs
        nodes = [p]
    elif node.op is Op.MUL and graph[node.inputs[1]].op is Op.RECIPROCAL:
        e, s = node.inputs[0], graph[node.inputs[1]].inputs[0]
        nodes = [p, node.inputs[1]]
    else:
        return None
    last = (node.tensor_type.rank - 1,)
    if not _is_row_reduce(graph, s, Op.SUM, e, last) or graph[e].op is not Op.EXP:
        return None
    x = graph[e].inputs[0]
    nodes += [s, e]
    if graph[x].op is Op.SUB and _is_row_reduce(graph, graph[x].inputs[1], Op.AMAX, graph[x].inputs[0], last):
        nodes += [x, graph[x].inputs[1]]
        x = graph[x].inputs[0]
    return (x, nodes) if graph[x].type == node.type else None


def _is_row_reduce(graph: Graph, name: str, op: Op, src: str, axes: tuple[int, ...]) -> bool:
    node = graph[name]
    return node.op is op and node.inputs == (src,) and node.attrs["axes"] == axes and node.attrs["keepdim"]


# -- constant masks -> causal -----------------------------------------------------------------


def _keeps_causal(graph: Graph, mask: _Mask, lq: int, lk: int) -> bool:
    """True if `mask` keeps exactly the top-left causal pattern j <= i (torch's is_causal)."""
    t = constant_value(graph, mask.value)
    if t is None or t.dim() < 2:
        return False
    try:
        t = torch.broadcast_to(t, (*t.shape[:-2], lq, lk))
    except RuntimeError:
        return False
    if mask.kind == "add":
        masked_ok = (t == 0) | (t <= _HUGE_NEGATIVE) | (t == torch.finfo(t.dtype).min)
        if not bool(masked_ok.all()):
            return False
        keep = t == 0
    else:
        keep = ~t if mask.negate else t
    want = torch.ones(lq, lk, dtype=torch.bool).tril()
    return bool((keep == want).all())


# -- matching -----------------------------------------------------------------------------------


def _key(graph: Graph, km: str, scale: float) -> tuple[str, tuple[int, ...] | None, float]:
    """(k, perm, scale) with K = PERMUTE(k, perm) (perm None: K = k) and K' = K^T."""
    base, scale, _ = _peel(graph, km, scale)
    node = graph[base]
    rank = node.tensor_type.rank
    swap = (*range(rank - 2), rank - 1, rank - 2)
    if node.op is not Op.PERMUTE:
        return base, swap, scale
    perm = tuple(node.attrs["perm"][i] for i in swap)  # permute by p, then swap: p[swap[i]]
    if perm != tuple(range(rank)):
        return node.inputs[0], perm, scale
    k, scale, _ = _peel(graph, node.inputs[0], scale)
    return k, None, scale


def _gqa(graph: Graph, name: str, batch: tuple[int, ...]) -> tuple[str, int] | None:
    """(u, n) when `name` = EXPAND(u) repeats a size-1 axis -3 of u n times (repeat_kv), in a
    layout whose flattening gives the heads of `batch` in repeat_interleave order."""
    node = graph[name]
    if node.op is not Op.EXPAND or not batch:
        return None
    us, es = _shape(graph, node.inputs[0]), node.tensor_type.shape
    if len(us) != len(es) or len(us) < 3 or us[-3] != 1 or es[-3] == 1:
        return None
    n = es[-3]
    if us[:-3] != es[:-3] or us[-2:] != es[-2:] or batch[-1] % n or math.prod(es[:-2]) != math.prod(batch):
        return None
    return node.inputs[0], n


def _float_cast(graph: Graph, node: Node) -> bool:
    return node.op is Op.CAST and graph[node.inputs[0]].tensor_type.dtype.is_float and node.tensor_type.dtype.is_float


def _uncast(graph: Graph, name: str) -> tuple[str, list[str]]:
    """Look through a float->float CAST (softmax computed in fp32 for a half-precision model)."""
    return (graph[name].inputs[0], [name]) if _float_cast(graph, graph[name]) else (name, [])


def _private(graph: Graph, chain: set[str], pv: str) -> bool:
    """No value of the chain escapes it (so removing the chain loses nothing)."""
    return all(not graph.is_output(n) and all(u in chain or u == pv for u in graph.users(n)) for n in chain)


def _dropout(graph: Graph, p: str) -> tuple[str, _Dropout, list[str]] | None:
    """(P, the dropout, its nodes) when `p` = P * CAST(RAND(seed) >= rate) * (1 / (1 - rate)),
    the decomposition of dropout (frontend/lower_random.py), either MUL order."""
    outer = graph[p]
    factor = _scale_factor(graph, outer) if outer.op is Op.MUL else None
    inner = graph[factor[0]] if factor else None
    if factor is None or inner is None or inner.op is not Op.MUL:
        return None
    for x, keep in (inner.inputs, inner.inputs[::-1]):
        cast = graph[keep]
        ge = graph[cast.inputs[0]] if cast.op is Op.CAST else cast
        rand = graph[ge.inputs[0]] if ge.op is Op.GE else None
        rate = _full_value(graph, ge.inputs[1]) if rand is not None else None
        if rand is None or rand.op is not Op.RAND or rate is None or not 0.0 < rate < 1.0:
            continue
        if abs(factor[1] * (1.0 - rate) - 1.0) > 1e-6 or _shape(graph, x) != rand.tensor_type.shape:
            continue
        nodes = [p, inner.name, *([keep] if cast.op is Op.CAST else []), ge.name, rand.name]
        return x, _Dropout(rand.inputs[0], rate, int(rand.attrs["stream"])), nodes
    return None


def _safe_softmax(graph: Graph, p: str) -> tuple[str, str, list[str]]:
    """(P, Z, nodes) when `p` = WHERE(ALL(Z == -inf), 0, P) (torch's math SDPA: a fully masked
    row gives 0, as the template does); else (p, "", [])."""
    node = graph[p]
    if node.op is not Op.WHERE or _full_value(graph, node.inputs[1]) != 0.0:
        return p, "", []
    cond = graph[node.inputs[0]]
    eq = graph[cond.inputs[0]] if cond.op is Op.ALL else None
    if eq is None or eq.op is not Op.EQ or _full_value(graph, eq.inputs[1]) != -math.inf:
        return p, "", []
    return node.inputs[2], eq.inputs[0], [p, cond.name, eq.name]


def _match(graph: Graph, pv_name: str, dropout: bool = False) -> _Match | None:
    pv = graph[pv_name]
    pm, vm = pv.inputs
    p, _, p_views = _peel(graph, pm, None)
    found = _dropout(graph, p) if dropout else None
    p, drop_nodes = (found[0], found[2]) if found else (p, [])
    p, safe_z, safe_nodes = _safe_softmax(graph, p) if found else (p, "", [])
    p, p_cast = _uncast(graph, p)
    soft = _softmax_input(graph, p)
    z, z_cast = _uncast(graph, soft[0]) if soft else ("", [])
    path = soft and _score_path(graph, z)
    folded = path and _fold_scores(graph, path)
    if not soft or not path or not folded or graph[z].tensor_type.dtype != pv.tensor_type.dtype:
        return None
    if safe_z and safe_z not in (z, soft[0]):
        return None
    chain = {*path, *soft[1], *p_views, *p_cast, *z_cast, *drop_nodes, *safe_nodes}
    zshape = _shape(graph, z)
    batch, (lq, lk) = zshape[:-2], zshape[-2:]
    if not _private(graph, chain, pv_name) or _shape(graph, pm)[:-2] != pv.tensor_type.shape[:-2]:
        return None
    scale, masks = folded
    q, scale, _ = _peel(graph, graph[path[0]].inputs[0], scale)
    k, k_perm, scale = _key(graph, graph[path[0]].inputs[1], scale)
    v = _peel(graph, vm, None)[0]
    k_shape = _shape(graph, k) if k_perm is None else tuple(_shape(graph, k)[i] for i in k_perm)
    shapes = [_shape(graph, q), k_shape, _shape(graph, v)]
    if [s[-2] for s in shapes] != [lq, lk, lk] or any(math.prod(s[:-2]) != math.prod(batch) for s in shapes):
        return None
    causal = len(masks) == 1 and _keeps_causal(graph, masks[0], lq, lk)
    masks = () if causal else masks
    if found and math.prod(_shape(graph, found[1].seed)) != 1:
        return None
    drop = found[1] if found else None
    return _Match(pv_name, frozenset(chain), q, k, k_perm, v, batch, scale, masks, causal, drop)


# -- rewriting ------------------------------------------------------------------------------------


class _Emitter:
    """Appends the SDPA (and the views/masks it needs) to the graph being rebuilt."""

    def __init__(self, graph: Graph, builder: GraphBuilder, alias: dict[str, str]) -> None:
        self.graph, self.b, self.alias = graph, builder, alias
        self.views: dict[str, str] = {}  # RESHAPEs emitted here -> their source (to fold chains)

    def name(self, x: str) -> str:
        return self.alias.get(x, x)

    def reshape(self, x: str, shape: tuple[int, ...]) -> str:
        # A reshape of a reshape is a reshape of the original (row-major), so look through.
        while x in self.graph and self.graph[x].op is Op.RESHAPE:
            x = self.graph[x].inputs[0]
        x = self.name(x)
        x = self.views.get(x, x)  # emitted views are never chained, so one step suffices
        if self.b.type_of(x).shape == shape:  # type: ignore[union-attr]
            return x
        out = self.b.add(Op.RESHAPE, [x], shape=shape)
        self.views[out] = x
        return out

    def full(self, value: float, dtype: DType) -> str:
        return self.b.add(Op.FULL, value=value, shape=(), dtype=dtype)

    def sdpa(self, m: _Match) -> str:
        g, b = self.graph, self.b
        out_type = g[m.pv].tensor_type
        k = m.k if m.k_perm is None else b.add(Op.PERMUTE, [self.name(m.k)], perm=m.k_perm)
        k_gqa, v_gqa = (_gqa(g, m.k, m.batch) if m.k_perm is None else None), _gqa(g, m.v, m.batch)
        gqa = bool(k_gqa and v_gqa and k_gqa[1] == v_gqa[1])
        if gqa:
            heads = (*m.batch[:-1], m.batch[-1] // k_gqa[1])  # type: ignore[index]
            k, v = k_gqa[0], v_gqa[0]  # type: ignore[index]
        else:
            heads, v = m.batch, m.v
        q = self.reshape(m.q, m.batch + self._tail(m.q))
        k = self.reshape(k, heads + self._tail(k))
        v = self.reshape(v, heads + self._tail(v))
        ins = [q, k, v, *self.mask(m.masks, out_type.dtype)]
        drop = {}
        if m.dropout is not None:  # the seed last; the RAND's stream, so the same mask bits
            ins.append(self.name(m.dropout.seed))
            drop = {"dropout": m.dropout.rate, "stream": m.dropout.stream}
        out = b.add(Op.SDPA, ins, name="sdpa", scale=m.scale, causal=m.causal, gqa=gqa, **drop)
        return self.reshape(out, out_type.shape)

    def _tail(self, x: str) -> tuple[int, ...]:
        return self.b.type_of(self.name(x)).shape[-2:]  # type: ignore[union-attr]

    def mask(self, masks: tuple[_Mask, ...], dtype: DType) -> list[str]:
        if not masks:
            return []
        if len(masks) == 1 and masks[0].kind == "keep":
            cond = self.name(masks[0].value)
            return [self.b.add(Op.LOGICAL_NOT, [cond])] if masks[0].negate else [cond]
        total = ""
        for m in masks:
            term = self.additive(m, dtype)
            total = self.b.add(Op.ADD, [total, term]) if total else term
        return [total]

    def additive(self, m: _Mask, dtype: DType) -> str:
        """The mask as a float to add to the scaled scores."""
        value = self.name(m.value)
        if m.kind == "add":
            return value if m.factor == 1.0 else self.b.add(Op.MUL, [value, self.full(m.factor, dtype)])
        fill = -math.inf if m.kind == "keep" else m.fill * m.factor
        kept, masked = self.full(0.0, dtype), self.full(fill, dtype)
        return self.b.add(Op.WHERE, [value, masked, kept] if m.negate else [value, kept, masked])


def _rewrite(graph: Graph, matches: dict[str, _Match]) -> Graph:
    b = GraphBuilder(reserved=[n.name for n in graph.nodes])
    alias: dict[str, str] = {}
    em = _Emitter(graph, b, alias)
    dropped = set().union(*(m.chain for m in matches.values()))
    for node in graph.nodes:
        if node.name in dropped:
            continue
        if node.inputs:
            node = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        if node.name in matches:
            alias[node.name] = em.sdpa(matches[node.name])
            continue
        if node.op is Op.RESHAPE and node.inputs[0] in em.views:  # fold reshape(reshape(sdpa))
            src = em.views[node.inputs[0]]
            if b.type_of(src) == node.type:
                alias[node.name] = src
                continue
            node = replace(node, inputs=(src,))
        b.add_node(node)
    return b.build([alias.get(o, o) for o in graph.outputs])


def fuse_attention(graph: Graph, dropout: bool = False) -> Graph:
    """Replace every recognised attention chain by one SDPA node (then drop what became dead).
    `dropout`: also chains with dropout on P (for a backend whose attention template draws the
    mask itself: Triton's; the C++ path keeps them decomposed, so both draw the same bits)."""
    matches: dict[str, _Match] = {}
    for node in graph.nodes:
        if node.op is Op.MATMUL:
            m = _match(graph, node.name, dropout)
            if m is not None:
                matches[node.name] = m
    return dce(_rewrite(graph, matches)) if matches else graph
