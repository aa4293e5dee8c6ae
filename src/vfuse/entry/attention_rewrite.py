"""Written-out attention in training graphs -> `F.scaled_dot_product_attention`, before AOTAutograd.

AOTAutograd differentiates the ops it is given: for `softmax(q @ k^T * s [+ mask]) @ v` written out,
the forward keeps the N x N probabilities for the backward, which runs its matmuls over them. Rewritten
in the Dynamo graph into SDPA, the joint graph has torch's CPU flash attention and its backward, which
vfuse lowers to its FlashAttention-2 templates SDPA_LSE / SDPA_BACKWARD (frontend/lower_attention.py):
O(N) memory, scores recomputed per tile from the saved logsumexp. Inference graphs are left to the IR
pass (passes/attention.py), which sees more (constant masks after freezing, GQA).

Attention with dropout on P (train mode: `F.scaled_dot_product_attention(dropout_p > 0)`, which torch's
CPU flash kernel does not do, and written-out `softmax -> dropout -> @ v`) becomes vfuse's own op pair
(entry/dropout.attention_dropout, frontend/attention_ops.py), lowered to the same templates with the mask
drawn from vfuse's counter RNG: the backward keeps an 8-byte seed, not the N x N mask and probabilities.

Where torch would not take its flash path (`torch._fused_sdp_choice`: 3-D inputs are unsqueezed to 4-D
first) or the cost model (`costs`) finds the written-out form cheaper, the graph is left as it is. Every
attention found is recorded (`AttentionDecision`, `VfuseBackend.attention`; TORCH_LOGS=vfuse).
"""

from __future__ import annotations

import logging
import math
import operator
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from vfuse.entry.attention_match import (
    DROPOUTS,
    IDENTITIES,
    MATMULS,
    SOFTMAXES,
    Match,
    NoMatch,
    ancestors,
    evaluate,
    is_causal_keep,
    match,
    target_of,
    trace_k,
    value,
)
from vfuse.entry.dropout import attention_dropout
from vfuse.fusion.cost import memory_bw
from vfuse.targets import Target

log = logging.getLogger("vfuse")  # entry/observe.py registers it with torch's logging
FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
# The written-out training attention crosses memory with an N x N tensor this many times: forward
# S, P written and read (P @ V, kept for the backward); backward dP written, P, dP read and dS
# written, dS read twice (dQ, dK), P read (dV).
WRITTEN_PASSES = 10
WRITTEN_KERNELS, FLASH_KERNELS = 7, 3  # matmuls and softmax rows vs SDPA_LSE, delta, SDPA_BACKWARD
# An additive mask row whose largest entry is below this is "fully masked" (see _check_additive): at
# |lse| ~ 1e3 fp32 rounding of lse is ~6e-5, within the 1e-4 the gradients are held to.
ADDITIVE_ROW_MIN = -1e3


@dataclass(frozen=True)
class AttentionDecision:
    """One written-out attention of a training graph: rewritten into SDPA or not, and why."""

    node: str  # the `P @ V` node of the Dynamo graph
    rewritten: bool
    reason: str
    shape: tuple[int, ...] = ()  # (batch x heads, Lq, Lk, D, Dv)
    causal: bool = False
    mask: str = "none"  # none | bool | additive
    written_s: float = 0.0  # predicted forward + backward time, written out
    flash_s: float = 0.0  # the same as SDPA_LSE + SDPA_BACKWARD
    dropout: float = 0.0  # dropout on P: rewritten into vfuse's attention_dropout, not SDPA

    def text(self) -> str:
        if not self.shape:
            return f"attention at {self.node}: left written out ({self.reason})"
        bh, lq, lk, d, dv = self.shape
        into = "vfuse's attention_dropout" if self.dropout else "SDPA"
        what = f"rewritten into {into}" if self.rewritten else "left written out"
        drop = f", dropout={self.dropout}" if self.dropout else ""
        return (
            f"attention at {self.node} [{bh} x {lq} x {lk}, d={d}, dv={dv}, causal={self.causal}, mask={self.mask}"
            f"{drop}]: "
            f"{what} ({self.reason}); predicted fwd+bwd {self.written_s * 1e6:.1f} us written out, "
            f"{self.flash_s * 1e6:.1f} us flash"
        )


def costs(shape: tuple[int, ...], causal: bool, target: Target) -> tuple[float, float]:
    """Predicted forward + backward seconds: (written out, flash templates). Both do the same matmul
    flops, 6 E (D + Dv) over E = BH Lq Lk scores; the written-out form moves the N x N tensors
    WRITTEN_PASSES times, each at the cost model's bandwidth for its size (fusion.cost.memory_bw);
    the flash backward recomputes S = Q K^T (2 E D) and exp, and skips tiles above a causal diagonal."""
    bh, lq, lk, d, dv = shape
    e = bh * lq * lk
    exp_rate = target.transcendental_f32 or target.vector_f32
    written = 6 * e * (d + dv) / target.peak_f32 + e / exp_rate + WRITTEN_PASSES * 4 * e / memory_bw(target, 4 * e)
    fe = e / 2 if causal else e
    flash = (6 * fe * (d + dv) + 2 * fe * d) / target.peak_f32 + 2 * fe / exp_rate
    return written + WRITTEN_KERNELS * target.launch_s, flash + FLASH_KERNELS * target.launch_s


def rewrite_attention(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    target: Callable[[], Target],
    record: Callable[[AttentionDecision], None] = lambda d: None,
) -> Rewritten:
    """Rewrite, in place, every written-out attention of a training Dynamo graph that an SDPA computes
    exactly and the cost model prefers. A causal mask read from a graph input (a tril buffer) becomes
    `is_causal` under a guard on that input's value (`Rewritten.guard`)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = {n: i for i, n in enumerate(placeholders)}
    inputs = {  # what a mask decision may read, under a guard: module buffers (not data, which changes per call)
        n: t
        for n, t in zip(placeholders, example_inputs)
        if isinstance(t, torch.Tensor) and not t.requires_grad and _is_buffer(n)
    }
    chosen: list[Match] = []
    sdpas: list[fx.Node] = []  # SDPA calls with dropout, rewritten into vfuse's attention_dropout
    for out in list(gm.graph.nodes):
        if _sdpa_dropout(out):
            decision = _decide_sdpa(out, target)
            sdpas += [out] if decision.rewritten else []
        elif _after_softmax(out):
            decision, m = _decide(out, gm, target, inputs)
            chosen += [m] if m is not None else []
        else:
            continue
        record(decision)
        log.info("vfuse: %s", decision.text())
    guarded = {positions[n]: inputs[n] for m in chosen for n in m.guards}
    original = _copy(gm) if guarded else None
    replaced: dict[fx.Node, fx.Node] = {}  # an attention's output -> its SDPA (another's q, k, v or mask)
    for m in chosen:
        _replace(_remapped(m, replaced), gm, replaced)
    for node in sdpas:
        node.target = attention_dropout  # the same arguments, by the same names
    if chosen or sdpas:
        gm.graph.lint()
        gm.recompile()
    return Rewritten(len(chosen) + len(sdpas), guarded, original)


@dataclass
class Rewritten:
    """What rewrite_attention did; `guard(fn)` wraps the compiled graph when a decision read inputs."""

    count: int
    guarded: dict[int, torch.Tensor]  # input position -> its value when compiled
    original: fx.GraphModule | None  # the graph before rewriting, run eagerly when a guard fails

    def guard(self, fn: Callable) -> Callable:
        if not self.guarded or self.original is None:
            return fn
        return torch._dynamo.disable(ValueGuard(fn, self.guarded, self.original), reason="vfuse guards")


class ValueGuard:
    """Runs the rewritten graph while the inputs a causal decision read hold the same values: the same
    tensor at the same version counter (O(1)), or equal to the value compiled with (checked, then
    remembered). Otherwise the original graph runs eagerly, with a warning (once)."""

    def __init__(self, fn: Callable, guarded: dict[int, torch.Tensor], original: fx.GraphModule) -> None:
        self.fn, self.original = fn, original
        self.values = {i: t.detach().clone() for i, t in guarded.items()}
        self.seen = {i: (weakref.ref(t), t._version) for i, t in guarded.items()}
        self.warned = False

    def __call__(self, *args: Any) -> Any:
        for i, value_then in self.values.items():
            t = args[i]
            ref, version = self.seen[i]
            if t is ref() and t._version == version:
                continue
            if t.shape == value_then.shape and t.dtype == value_then.dtype and torch.equal(t, value_then):
                self.seen[i] = (weakref.ref(t), t._version)
                continue
            if not self.warned:
                warnings.warn(
                    f"vfuse: input {i} no longer holds the causal mask its attention was compiled for; "
                    "running the graph eagerly",
                    stacklevel=2,
                )
                self.warned = True
            return self.original(*args)
        return self.fn(*args)


def _sdpa_dropout(node: fx.Node) -> bool:
    """`F.scaled_dot_product_attention` with a constant dropout_p > 0 (a module in train mode)."""
    if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
        return False
    p = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
    return isinstance(p, (int, float)) and p > 0


def _decide_sdpa(node: fx.Node, target: Callable[[], Target]) -> AttentionDecision:
    """torch's CPU flash kernel has no dropout, so torch would take its math path (N x N scores and
    mask kept for the backward): vfuse's attention_dropout whenever its kernels compute the call."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = {n: value(x) for n, x in zip(names, node.args, strict=False)}
    a.update({n: value(x) for n, x in node.kwargs.items()})
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    try:
        _check_sdpa(q, k, v, mask, a)
    except NoMatch as e:
        return AttentionDecision(node.name, False, str(e))
    # Symbolic sizes (dynamic=True) are fine, the templates take run-time sizes: recorded at their hints.
    shape = tuple(_hint(x) for x in (math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]))
    causal = bool(a.get("is_causal", False))
    kind = "none" if mask is None else "bool" if mask.dtype == torch.bool else "additive"
    written, flash = costs(shape, causal, target())
    why = "torch's CPU flash attention has no dropout (its math path keeps N x N tensors)"
    return AttentionDecision(node.name, True, why, shape, causal, kind, written, flash, float(a["dropout_p"]))


def _check_sdpa(q: Any, k: Any, v: Any, mask: Any, a: dict[str, Any]) -> None:
    """NoMatch unless vfuse's kernels compute this SDPA call: fp32 CPU tensors of rank 3 or 4 (sizes static
    or symbolic: the shape checks below guard), query heads grouped over key heads, a constant 0 < p < 1,
    a mask needing no gradient."""
    tensors = [t for t in (q, k, v, mask) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise NoMatch("SDPA operands are not tensors")
    if any(t.device.type != "cpu" for t in tensors):
        raise NoMatch("SDPA with dropout on another device")
    if any(_hint(d) is None for t in tensors for d in t.shape):
        raise NoMatch("SDPA with dropout with a data-dependent size")
    if any(t.dtype != torch.float32 for t in (q, k, v)) or q.dim() not in (3, 4) or not q.dim() == k.dim() == v.dim():
        raise NoMatch(f"SDPA with dropout on {q.dtype} of rank {q.dim()} (fp32, rank 3 or 4)")
    if (
        k.shape[:-1] != v.shape[:-1]
        or q.shape[:-3] != k.shape[:-3]
        or q.shape[-3] % k.shape[-3]
        or q.shape[-1] != k.shape[-1]
    ):
        raise NoMatch(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
    if not isinstance(a.get("is_causal", False), bool) or not isinstance(a.get("scale"), (int, float, type(None))):
        raise NoMatch("SDPA with a run-time is_causal or scale")
    if not 0 < a["dropout_p"] < 1:
        raise NoMatch(f"dropout_p {a['dropout_p']} outside (0, 1)")
    if mask is not None:
        scores = (*q.shape[:-1], k.shape[-2])
        if mask.dtype not in (torch.bool, torch.float32) or mask.requires_grad or mask.dim() > q.dim():
            raise NoMatch(f"attn_mask {mask.dtype} {tuple(mask.shape)} (bool or fp32 without gradient)")
        if torch.broadcast_shapes(mask.shape, scores) != scores:
            raise NoMatch(f"attn_mask {tuple(mask.shape)} does not broadcast to the scores {scores}")


def _hint(size: Any) -> int | None:
    """A size's value at compile time: an int, or a symbolic size's hint (None for a data-dependent one)."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        return None if hint is None else int(hint)
    return int(size)


def _is_buffer(node: fx.Node) -> bool:
    source = getattr(node.meta.get("grapharg"), "source", None)
    return source is not None and "._buffers[" in source.name


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def _after_softmax(out: fx.Node) -> bool:
    """A matmul whose left operand is a softmax within a few identity ops: what looks like attention."""
    if target_of(out) not in MATMULS or len(out.args) != 2:
        return False
    p = out.args[0]
    for _ in range(4):
        if not isinstance(p, fx.Node):
            return False
        if target_of(p) in SOFTMAXES:
            return True
        if target_of(p) not in IDENTITIES | DROPOUTS or not p.args:
            return False
        p = p.args[0]
    return False


def _decide(
    out: fx.Node, gm: fx.GraphModule, target: Callable[[], Target], inputs: dict[fx.Node, Any]
) -> tuple[AttentionDecision, Match | None]:
    try:
        m = match(out, gm, inputs)
        _causal_or_mask(m, gm)
        _check_additive(m, gm)
        shape = _shape(m)
        if not m.dropout:  # with dropout vfuse's own op pair computes it, not torch's flash kernel
            _check_flash(m)
    except NoMatch as e:
        return AttentionDecision(out.name, False, str(e)), None
    except Exception as e:  # a graph the matcher did not foresee: left as it is, visibly
        log.warning("vfuse: attention at %s not examined: %s: %s", out.name, type(e).__name__, e)
        return AttentionDecision(out.name, False, f"not examined ({type(e).__name__}: {e})"), None
    written, flash = costs(shape, m.causal, target())
    kind = "none" if not (m.keep or m.additive) else "bool" if not m.additive and len(m.keep) == 1 else "additive"
    figures = (shape, m.causal, kind, written, flash, m.dropout)
    if flash >= written:
        return AttentionDecision(out.name, False, "the cost model predicts the written-out form faster", *figures), None
    why = "exact, and predicted faster" + (f"; guarded on {', '.join(n.name for n in m.guards)}" if m.guards else "")
    return AttentionDecision(out.name, True, why, *figures), m


def _shape(m: Match) -> tuple[int, ...]:
    q, kt, v = value(m.q), value(m.kt), value(m.v)
    return (math.prod(q.shape[:-2]), q.shape[-2], kt.shape[-1], q.shape[-1], v.shape[-1])


def _causal_or_mask(m: Match, gm: fx.GraphModule) -> None:
    """The only mask, if it evaluates to torch's top-left causal pattern, becomes `is_causal` (m.causal);
    one that keeps everything is dropped. A keep-mask, or an additive mask of 0 and -inf / <= -1e30
    (HF's `finfo.min` masks: exact here, as a causal mask leaves no row fully masked). Evaluated from
    constants, else from the module buffers it reads (m.inputs), which then become m.guards."""
    if len(m.keep) + len(m.additive) != 1:
        return
    node = _node(m.keep[0]) if m.keep else m.additive[0][0]
    try:
        const, read = evaluate(node, gm), []
    except NoMatch:
        try:
            const = evaluate(node, gm, dict(m.inputs))
        except NoMatch:
            return
        read = [n for n in ancestors(node) if n in m.inputs]
    if not isinstance(const, torch.Tensor):
        return
    if m.keep:
        keep = ~const.bool() if isinstance(m.keep[0], tuple) else const.bool()
    elif const.is_floating_point() and bool(((const == 0) | (const <= -1e30)).all()):
        keep = const == 0
    else:
        return
    lq, lk = value(m.q).shape[-2], value(m.kt).shape[-1]
    if is_causal_keep(keep, lq, lk) or bool(keep.all()):
        m.causal, m.keep, m.additive = is_causal_keep(keep, lq, lk), [], []
        m.guards += [n for n in read if n not in m.guards]


def _check_additive(m: Match, gm: fx.GraphModule) -> None:
    """Additive masks must be known at compile time (constants, guarded buffers) and keep every row's
    largest entry above ADDITIVE_ROW_MIN: for a row masked to finfo.min throughout eager's softmax is
    uniform and its gradient flows, but the flash backward's P = exp(S - lse) loses log(l) to the
    rounding of lse at that magnitude (P = 1, not 1 / Lk)."""
    total: torch.Tensor | float = 0.0
    for mask, after in m.additive:
        try:
            total = total + evaluate(mask, gm) * after
        except NoMatch:
            try:
                total = total + evaluate(mask, gm, dict(m.inputs)) * after
            except NoMatch:
                raise NoMatch(f"run-time additive mask {mask.name}: a fully masked row would differ") from None
            m.guards += [n for n in ancestors(mask) if n in m.inputs and n not in m.guards]
    if isinstance(total, torch.Tensor) and total.numel() and float(total.amax(-1).min()) < ADDITIVE_ROW_MIN:
        raise NoMatch(f"additive mask with a fully masked row (row max {float(total.amax(-1).min()):.3g})")


def _example(t: torch.Tensor, swap: bool = False, rank4: bool = False) -> torch.Tensor:
    """An uninitialized real tensor with t's sizes, strides and requires_grad (torch's SDPA choice
    reads them; fake tensors always get the math path)."""
    size, stride = list(t.shape), list(t.stride())
    if swap:
        size[-2:], stride[-2:] = size[-2:][::-1], stride[-2:][::-1]
    if rank4:
        size, stride = [1, *size], [size[0] * stride[0] if size else 1, *stride]
    return torch.empty_strided(size, stride, dtype=t.dtype).requires_grad_(t.requires_grad)


def _check_flash(m: Match) -> None:
    """torch's CPU dispatch must pick its flash kernel for the SDPA (what vfuse's templates lower)."""
    k, own = trace_k(m.kt)
    rank4 = value(m.q).dim() == 3
    q = _example(value(m.q), rank4=rank4)
    kk = _example(value(k), rank4=rank4) if own else _example(value(m.kt), swap=True, rank4=rank4)
    v = _example(value(m.v), rank4=rank4)
    mask = None
    if m.additive or m.keep:
        shape = torch.broadcast_shapes(*(tuple(value(_node(x)).shape) for x in _mask_nodes(m)))
        shape = (1, *shape) if rank4 and len(shape) == 3 else shape
        mask = torch.empty(shape, dtype=torch.float32 if m.additive or len(m.keep) > 1 else torch.bool)
    choice = torch._fused_sdp_choice(q, kk, v, attn_mask=mask, dropout_p=0.0, is_causal=m.causal, scale=m.scale)
    if choice != FLASH:
        raise NoMatch(f"torch's CPU dispatch would not take its flash attention (backend {choice}): no gain")


def _mask_nodes(m: Match) -> list[Any]:
    return [a for a, _ in m.additive] + list(m.keep)


def _node(mask: Any) -> fx.Node:
    """The node of a mask entry (a keep-mask may be ("not", node))."""
    return mask[1] if isinstance(mask, tuple) else mask


def _remapped(m: Match, replaced: dict[fx.Node, fx.Node]) -> Match:
    """m with the operands an earlier rewrite replaced (one attention's output as the next's q, say)."""

    def get(x: Any) -> Any:
        return ("not", replaced.get(x[1], x[1])) if isinstance(x, tuple) else replaced.get(x, x)

    m.q, m.kt, m.v = get(m.q), get(m.kt), get(m.v)
    m.additive = [(get(a), after) for a, after in m.additive]
    m.keep = [get(k) for k in m.keep]
    return m


def _replace(m: Match, gm: fx.GraphModule, replaced: dict[fx.Node, fx.Node]) -> None:
    g = gm.graph
    rank3 = value(m.q).dim() == 3
    with g.inserting_before(m.out):
        k, own = trace_k(m.kt)
        if not own:
            k = g.call_function(torch.transpose, (m.kt, -2, -1))
        q, v = m.q, m.v
        if rank3:
            q, k, v = (g.call_function(torch.unsqueeze, (x, 0)) for x in (q, k, v))
        mask = _mask(m, g, rank3)
        kwargs = {"attn_mask": mask, "dropout_p": m.dropout, "is_causal": m.causal, "scale": m.scale}
        new = g.call_function(attention_dropout if m.dropout else F.scaled_dot_product_attention, (q, k, v), kwargs)
        if rank3:
            new = g.call_function(torch.squeeze, (new, 0))
    new.meta = dict(m.out.meta)
    replaced[m.out] = new
    m.out.replace_all_uses_with(new)
    _erase_dead(g, [m.out])


def _erase_dead(g: fx.Graph, todo: list[fx.Node]) -> None:
    """Erase what the SDPA left without users: the chain and its masks' computation; never a graph
    input (Dynamo passes every argument) nor anything impure (graph-wide DCE could drop Dynamo's
    grad-mode switches)."""
    while todo:
        node = todo.pop()
        if not node._erased and not node.users and node.op in ("call_function", "call_method") and not node.is_impure():
            inputs = node.all_input_nodes
            g.erase_node(node)
            todo += inputs


def _mask(m: Match, g: fx.Graph, rank3: bool) -> fx.Node | None:
    """One mask for SDPA: a single keep-mask as it is (boolean), otherwise the sum of the additive
    masks, each times the scale factors applied after it, and -inf where a keep-mask is False."""
    keeps = [g.call_function(torch.logical_not, (k[1],)) if isinstance(k, tuple) else k for k in m.keep]
    if not m.additive and len(keeps) == 1:
        mask = keeps[0]
    elif m.additive or keeps:
        terms = [a if after == 1.0 else g.call_function(operator.mul, (a, after)) for a, after in m.additive]
        terms += [g.call_function(torch.where, (k, 0.0, -math.inf)) for k in keeps]
        mask = terms[0]
        for t in terms[1:]:
            mask = g.call_function(operator.add, (mask, t))
    else:
        return None
    if rank3 and _mask_rank(m) == 3:
        mask = g.call_function(torch.unsqueeze, (mask, 0))
    return mask


def _mask_rank(m: Match) -> int:
    return max(value(_node(x)).dim() for x in _mask_nodes(m))
