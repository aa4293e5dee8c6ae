"""Written-out attention in a Dynamo FX graph (torch-level ops, before AOTAutograd):
`softmax(q @ kT [* c | / c] [+ mask | masked_fill(cond, -inf) | where]) [-> identity dropout] @ v`.

Only the matching: `Match` says what SDPA call would compute the same values, or why there is
none (`NoMatch.reason`). entry/attention_rewrite.py decides and rewrites. A match is exact: the
same scale (a product of positive scalar factors), masks that torch's SDPA applies the same way,
at most one dropout on P (`Match.dropout`: vfuse's op pair draws it, entry/dropout.attention_dropout),
and every intermediate (scores, probabilities) used by the chain only.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

MATMULS = {operator.matmul, torch.matmul, torch.bmm, torch.Tensor.matmul, torch.Tensor.bmm}
SOFTMAXES = {torch.softmax, F.softmax, torch.Tensor.softmax, torch.special.softmax}
DROPOUTS = {F.dropout, torch.dropout, torch.nn.functional.dropout}
MULS = {operator.mul, torch.mul, torch.Tensor.mul}
DIVS = {operator.truediv, torch.div, torch.Tensor.div}
ADDS = {operator.add, torch.add, torch.Tensor.add}
MASKED_FILLS = {torch.masked_fill, torch.Tensor.masked_fill}
NOTS = {operator.invert, torch.logical_not, torch.bitwise_not, torch.Tensor.logical_not, torch.Tensor.bitwise_not}
TRANSPOSES = {torch.transpose, torch.Tensor.transpose}
# Casts and copies that leave an fp32 tensor's values as they are (every node of a match is fp32).
IDENTITIES = {torch.Tensor.to, torch.Tensor.float, torch.Tensor.type, torch.Tensor.type_as, torch.Tensor.contiguous}
# Constant subgraphs are evaluated at compile time; nothing random is.
RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform", "seed")


class NoMatch(Exception):
    """Not an exactly equivalent SDPA; the message says why (recorded with the decision)."""


@dataclass
class Match:
    """What `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)` replaces `out`."""

    out: fx.Node  # the `P @ v` node
    q: fx.Node
    kt: fx.Node  # K with its last two axes swapped, as the scores matmul reads it
    v: fx.Node
    scale: float = 1.0
    additive: list[tuple[Any, float]] = field(default_factory=list)  # (mask, factor applied after it)
    keep: list[Any] = field(default_factory=list)  # boolean keep-masks (True: attend): a node or ("not", node)
    causal: bool = False
    guards: list[fx.Node] = field(default_factory=list)  # graph inputs whose values a decision read
    inputs: dict[fx.Node, torch.Tensor] = field(default_factory=dict)  # what may be read: no-grad tensor inputs
    chain: list[fx.Node] = field(default_factory=list)  # every node the SDPA makes dead
    dropout: float = 0.0  # a training dropout's rate on P (then vfuse's attention_dropout, not SDPA)


def target_of(node: fx.Node) -> Any:
    """The function a call_function or call_method node computes (methods as torch.Tensor's)."""
    if node.op == "call_function":
        return node.target
    if node.op == "call_method":
        return getattr(torch.Tensor, str(node.target), None)
    return None


def value(node: Any) -> Any:
    """The fake value Dynamo recorded for a node (its shape, dtype), or the constant itself."""
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def evaluate(node: Any, gm: fx.GraphModule, memo: dict[fx.Node, Any] | None = None) -> Any:
    """The value of a node computed from constants only (tril of ones, aranges, torch.full, ...);
    raises NoMatch when it reads a graph input, draws random numbers or is updated in place.
    `memo` may hold the values of graph inputs to read (placeholders): a guarded evaluation."""
    memo = {} if memo is None else memo
    result = _evaluate(node, gm, memo)
    for mutation in (n for n in gm.graph.nodes if _mutates(n)):
        if isinstance(mutation.args[0], fx.Node) and ancestors(mutation.args[0]) & memo.keys():
            raise NoMatch(f"{mutation.name} updates the mask in place")
    return result


def _mutates(node: fx.Node) -> bool:
    """setitem, in-place methods and functions (`x.fill_`, `torch.relu_`), out= arguments."""
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    in_place = node.target is operator.setitem or (name.endswith("_") and not name.startswith("_"))
    return node.op in ("call_function", "call_method") and node.args != () and (in_place or "out" in node.kwargs)


def ancestors(node: fx.Node) -> set[fx.Node]:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def _evaluate(node: Any, gm: fx.GraphModule, memo: dict[fx.Node, Any]) -> Any:
    if isinstance(node, (list, tuple)):
        return type(node)(_evaluate(a, gm, memo) for a in node)
    if isinstance(node, slice):
        return slice(*(_evaluate(a, gm, memo) for a in (node.start, node.stop, node.step)))
    if not isinstance(node, fx.Node):
        return node
    if node in memo:
        return memo[node]
    fn = target_of(node) if node.op != "get_attr" else None
    name = getattr(fn, "__name__", "")
    if node.op == "get_attr":
        result = getattr(gm, str(node.target))
    elif fn is None or any(w in name for w in RANDOM_WORDS):
        raise NoMatch(f"{node.name} is not a compile-time constant")
    else:
        args = _evaluate(node.args, gm, memo)
        kwargs = {k: _evaluate(a, gm, memo) for k, a in node.kwargs.items()}
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # whatever it is, no constant to decide by
            raise NoMatch(f"{node.name} does not evaluate at compile time ({type(e).__name__})") from None
    memo[node] = result
    return result


def scalar(x: Any, gm: fx.GraphModule) -> float:
    """A Python number, or a one-element constant tensor (HF's `torch.full([], sqrt(d))`)."""
    if isinstance(x, fx.Node):
        t = evaluate(x, gm)
        if not isinstance(t, torch.Tensor) or t.numel() != 1:
            raise NoMatch(f"{x.name} is not a scalar")
        return float(t.item())
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise NoMatch(f"{x!r} is not a scalar")


def _single_user(node: fx.Node, user: fx.Node) -> None:
    if list(node.users) != [user]:
        others = ", ".join(u.name for u in node.users if u is not user) or "a graph output"
        raise NoMatch(f"{node.name} is used outside the attention ({others})")


def _probabilities(p: fx.Node, out: fx.Node, m: Match) -> fx.Node:
    """Walk from P back to the softmax through identities (fp32 casts, dropout that drops nothing)
    and at most one training dropout (m.dropout); returns the softmax's input."""
    user, chain = out, m.chain
    while True:
        _single_user(p, user)
        chain.append(p)
        fn = target_of(p)
        if fn in DROPOUTS:
            rate, training = (
                float(arg(p, 1, "p", 0.5)),
                arg(p, 2, "training" if fn is not torch.dropout else "train", True),
            )
            if rate > 0 and training is not False:
                if training is not True or not rate < 1.0 or m.dropout or arg(p, 3, "inplace", False) is not False:
                    raise NoMatch(f"attention dropout ({p.name}, p={rate}, training={training}): not one plain draw")
                m.dropout = rate
        elif fn in IDENTITIES:
            pass  # fp32 in and out (checked on every node of the chain): the same tensor
        elif fn in SOFTMAXES:
            dim, dtype = arg(p, 1, "dim"), arg(p, 2, "dtype")
            if dim not in (-1, value(p).dim() - 1) or dtype not in (None, torch.float32):
                raise NoMatch(f"{p.name}: softmax over dim {dim} (dtype {dtype}), not the last")
            return p.args[0]
        else:
            raise NoMatch(f"{p.name} ({p.target}) between the softmax and the P @ V matmul")
        user, p = p, p.args[0]


def _fill(node: fx.Node, fill: Any, cond: Any, keep_when: bool, m: Match, gm: fx.GraphModule) -> None:
    """A masked score: `cond == keep_when` keeps it, elsewhere `fill`. -inf is SDPA's boolean mask;
    a huge finite fill (finfo.min) is the same only if every row keeps a key (a fully masked row is
    uniform in eager): checked on a constant cond, or on one read from graph inputs that need no
    gradient (a causal buffer), which then become m.guards; else no match."""
    f = scalar(fill, gm)
    if f == -math.inf:
        m.keep.append(cond if keep_when else _negated(cond))
        return
    if f > -1e30:
        raise NoMatch(f"{node.name}: fill {f} is not -inf or finfo.min (a fully masked row differs from SDPA's)")
    try:
        keep = evaluate(cond, gm) == keep_when
    except NoMatch:
        try:
            keep = evaluate(cond, gm, dict(m.inputs)) == keep_when
        except NoMatch as e:
            raise NoMatch(f"{node.name}: finfo.min fill of a run-time mask (fully masked rows differ): {e}") from None
        m.guards += [n for n in ancestors(cond) if n in m.inputs and n not in m.guards]
    if not torch.broadcast_to(keep, value(node).shape).any(-1).all():
        raise NoMatch(f"{node.name}: finfo.min fill with a fully masked row (uniform in eager, 0 in SDPA)")
    m.keep.append(cond if keep_when else _negated(cond))


def _negated(cond: Any) -> Any:
    """The keep-mask of `masked_fill(cond, -inf)`: `~x` gives x back; otherwise a marker to negate."""
    if isinstance(cond, fx.Node) and target_of(cond) in NOTS:
        return cond.args[0]
    return ("not", cond)


def _scores(s: fx.Node, m: Match, gm: fx.GraphModule) -> None:
    """Walk from the softmax's input back to `q @ kT`, collecting scale factors and masks."""
    after = 1.0  # the product of the factors applied after the current node
    user = m.chain[-1]
    while True:
        _single_user(s, user)
        m.chain.append(s)
        fn, a = target_of(s), s.args
        if fn in MATMULS:
            m.q, m.kt, m.scale = a[0], a[1], after
            return
        if fn in IDENTITIES:
            user, s = s, a[0]
            continue
        tensors = [x for x in a[:2] if isinstance(x, fx.Node) and isinstance(value(x), torch.Tensor)]
        if fn in MULS | DIVS and len(a) == 2:
            i = 0 if a[0] in tensors and value(a[0]).shape == value(s).shape else 1
            c = scalar(a[1 - i], gm)
            if fn in DIVS and (i == 1 or s.kwargs.get("rounding_mode")):
                raise NoMatch(f"{s.name}: a division of a scalar by the scores")
            c = 1.0 / c if fn in DIVS else c
            if not c > 0 or not math.isfinite(c):
                raise NoMatch(f"{s.name}: scale {c} is not positive and finite")
            after *= c
        elif fn in ADDS and len(a) == 2 and len(tensors) == 2 and "alpha" not in s.kwargs:
            i = 0 if _leads_to_scores(a[0]) else 1
            if value(a[i]).shape != value(s).shape:
                raise NoMatch(f"{s.name}: the mask broadcasts the scores up")
            m.additive.append((a[1 - i], after))
        elif fn in MASKED_FILLS and a[0] in tensors and value(a[0]).shape == value(s).shape:
            _fill(s, arg(s, 2, "value"), arg(s, 1, "mask"), False, m, gm)
            i = 0
        elif fn is torch.where and len(a) == 3 and a[1] in tensors and value(a[1]).shape == value(s).shape:
            _fill(s, a[2], a[0], True, m, gm)
            i = 1
        elif fn is torch.where and len(a) == 3 and a[2] in tensors and value(a[2]).shape == value(s).shape:
            _fill(s, a[1], a[0], False, m, gm)
            i = 2
        else:
            raise NoMatch(f"{s.name} ({s.target}) in the scores, not a scale or a mask")
        user, s = s, a[i]
        if not isinstance(s, fx.Node):
            raise NoMatch(f"{user.name}: scores are not a tensor")


def _leads_to_scores(x: Any, steps: int = 8) -> bool:
    """Whether x is the scores side of an addition: a matmul behind scale and mask ops."""
    for _ in range(steps):
        if not isinstance(x, fx.Node):
            return False
        fn = target_of(x)
        if fn in MATMULS:
            return True
        if fn not in MULS | DIVS | ADDS | MASKED_FILLS and fn is not torch.where:
            return False
        tensors = [a for a in x.args if isinstance(a, fx.Node)]
        if fn in ADDS:
            return any(_leads_to_scores(a, steps - 1) for a in tensors)
        if fn is torch.where:
            return any(_leads_to_scores(a, steps - 1) for a in x.args[1:])
        x = x.args[0] if x.args[0] in tensors else x.args[1]
    return False


def _check_types(m: Match) -> None:
    """fp32 everywhere, q [.., Lq, D], kT [.., D, Lk], v [.., Lk, Dv] with the same batch axes, rank 3 or 4;
    masks broadcast to the scores without growing them."""
    q, kt, v, out = (value(x) for x in (m.q, m.kt, m.v, m.out))
    for node in [m.q, m.kt, m.v, *m.chain]:
        t = value(node)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise NoMatch(f"{node.name} is {getattr(t, 'dtype', type(t).__name__)}, not float32")
        if any(not isinstance(d, int) for d in t.shape):
            raise NoMatch(f"{node.name} has symbolic sizes")
    if q.dim() not in (3, 4) or not (q.dim() == kt.dim() == v.dim()):
        raise NoMatch(f"q, k, v of ranks {q.dim()}, {kt.dim()}, {v.dim()} (3 or 4, equal)")
    if (
        not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2])
        or q.shape[-1] != kt.shape[-2]
        or kt.shape[-1] != v.shape[-2]
    ):
        raise NoMatch(f"q {tuple(q.shape)}, kT {tuple(kt.shape)}, v {tuple(v.shape)} do not chain without broadcasting")
    scores = (*q.shape[:-1], kt.shape[-1])
    for mask, _ in m.additive:
        t = value(mask)
        if t.dtype != torch.float32 or t.requires_grad or torch.broadcast_shapes(t.shape, scores) != scores:
            raise NoMatch(f"additive mask {mask.name}: {t.dtype} {tuple(t.shape)}, grad {t.requires_grad}")
        if t.dim() > q.dim():
            raise NoMatch(f"additive mask {mask.name} has more axes than the scores")
    if tuple(out.shape) != (*q.shape[:-1], v.shape[-1]):
        raise NoMatch(f"{m.out.name}: output {tuple(out.shape)}")


def match(out: fx.Node, gm: fx.GraphModule, inputs: dict[fx.Node, torch.Tensor] | None = None) -> Match:
    """The SDPA that computes `out`, or NoMatch naming why not. `inputs`: graph inputs whose values
    (at compile time, then guarded) a mask decision may read."""
    if target_of(out) not in MATMULS or len(out.args) != 2 or out.kwargs:
        raise NoMatch(f"{out.name} is not a matmul")
    p, v = out.args
    if not isinstance(p, fx.Node) or not isinstance(v, fx.Node):
        raise NoMatch(f"{out.name}: operands are not tensors")
    m = Match(out, out, out, v, inputs=inputs or {})
    s = _probabilities(p, out, m)
    if not isinstance(s, fx.Node):
        raise NoMatch("softmax of a constant")
    _scores(s, m, gm)
    _check_types(m)
    return m


def is_causal_keep(keep: torch.Tensor, lq: int, lk: int) -> bool:
    """Whether a boolean keep-mask is torch's `is_causal` (top-left `tril(ones(lq, lk))`) on every slice."""
    if keep.dim() < 2 or keep.shape[-2:] != (lq, lk):
        return False
    tril = torch.ones(lq, lk, dtype=torch.bool).tril()
    return bool(torch.equal(torch.broadcast_to(tril, keep.shape), keep.bool()))


def trace_k(kt: fx.Node) -> tuple[fx.Node | None, bool]:
    """K itself when kT is `k.transpose(-2, -1)` (or the same axes by number) or `k.mT`: (k, True)."""
    fn, a = target_of(kt), kt.args
    if fn in TRANSPOSES and len(a) == 3:
        rank = value(kt).dim()
        dims = {d % rank for d in a[1:] if isinstance(d, int)}
        if dims == {rank - 2, rank - 1} and isinstance(a[0], fx.Node):
            return a[0], True
    if kt.op == "call_function" and kt.target is getattr and kt.args[1:] == ("mT",):
        return kt.args[0], True
    return None, False
