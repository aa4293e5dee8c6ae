"""Attention for training: the forward that also returns the softmax's logsumexp, and the
FlashAttention-2 backward that recomputes the probabilities from it.

Every IR op has one output, so both return one flat fp32 tensor that the frontend slices
(`frontend/lower_attention.py`): SDPA_LSE is `out` then `lse`, SDPA_BACKWARD is `dq`, `dk`,
`dv`, each row-major; with `stacked=True` (q, k, v of one shape) the same bytes are typed
`[3, *q.shape]`, the stack AOTAutograd builds for a fused qkv projection's gradient, so that
stack is the op's own output (passes/stack_pieces.py) and no copy; a stacked output that is only read
through a permutation keeping the head size innermost (AOTAutograd's [B, L, 3, H, D] for the qkv
projection) is stored in that order instead (attr `perm`, and `shape` for the reshapes that follow it:
passes/grad_layout.py), so its readers see contiguous rows. The backward takes
`delta = rowsum(dO * out)` as an input: the frontend computes it with primitives (a row
kernel), so the template's workspace stays independent of the sequence lengths. Both are fp32
only: the frontend keeps other dtypes in torch.
"""

from __future__ import annotations

import math

import torch

from vfuse.ir import shapes
from vfuse.ir.defs import rules
from vfuse.ir.defs.contraction import sdpa_dropout
from vfuse.ir.defs.rng import uniform
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type

_ATTRS = ("scale", "causal", "gqa")


def _check_qkv(q: TensorType, k: TensorType, v: TensorType) -> None:
    if any(t.dtype is not DType.F32 for t in (q, k, v)):
        raise rules.TypeRuleError(f"training attention is fp32 only, got q {q}, k {k}, v {v}")
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank or k.shape[-1] != q.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        raise rules.TypeRuleError(f"attention shapes do not agree: q {q}, k {k}, v {v}")
    if q.rank >= 3 and (q.shape[:-3] != k.shape[:-3] or q.shape[-3] % k.shape[-3]):
        raise rules.TypeRuleError(f"query heads of q {q} do not group over the key heads of k {k}")


def _check_mask(mask: TensorType, q: TensorType, k: TensorType) -> None:
    scores = q.shape[:-1] + (k.shape[-2],)
    if mask.dtype not in (DType.F32, DType.BOOL) or shapes.broadcast(mask.shape, scores) != scores:
        raise rules.TypeRuleError(f"mask {mask} is not f32/bool broadcasting to scores {scores}")


def _check_row(t: TensorType, q: TensorType, what: str) -> None:
    if t.dtype is not DType.F32 or t.shape != q.shape[:-1]:
        raise rules.TypeRuleError(f"{what} must be f32{list(q.shape[:-1])}, got {t}")


def lse_sizes(q: tuple[int, ...], v: tuple[int, ...]) -> tuple[int, int]:
    """(elements of out, of lse) in SDPA_LSE's flat output."""
    return math.prod(q[:-1]) * v[-1], math.prod(q[:-1])


def grad_sizes(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> tuple[int, int, int]:
    """(elements of dq, dk, dv) in SDPA_BACKWARD's flat output."""
    return math.prod(q), math.prod(k), math.prod(v)


def grad_row_strides(q: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Strides in floats of a stacked SDPA_BACKWARD output stored permuted by `perm`: (from dq to dk
    and dk to dv, batch, head, row); the batch stride is 0 for q without a batch axis."""
    stacked = (3, *q)
    out = [stacked[p] for p in perm]
    strides = [math.prod(out[i + 1 :]) for i in range(len(out))]
    of = {axis: strides[i] for i, axis in enumerate(perm)}  # stride of each axis of [3, (B,) H, L, D]
    batch = of[1] if len(q) == 4 else 0
    return of[0], batch, of[len(q) - 2], of[len(q) - 1]


def _check_seed(ins: tuple[TensorType, ...], attrs: Attrs) -> int:
    """With dropout the last input is the i64 seed: the number of inputs before it."""
    p = sdpa_dropout(attrs)
    if not p:
        return len(ins)
    if not 0.0 < p < 1.0 or not isinstance(attrs.get("stream"), int):
        raise rules.TypeRuleError(f"attention dropout {p} must be in (0, 1) with an int stream")
    if ins[-1].dtype is not DType.I64 or ins[-1].shape != ():
        raise rules.TypeRuleError(f"attention dropout needs an i64 seed as its last input, got {ins[-1]}")
    return len(ins) - 1


def _lse_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    q, k, v = ins[:3]
    _check_qkv(q, k, v)
    if _check_seed(ins, attrs) == 4:
        _check_mask(ins[3], q, k)
    return TensorType((sum(lse_sizes(q.shape, v.shape)),), DType.F32)


def _bwd_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    do, q, k, v, lse, delta = ins[:6]
    _check_qkv(q, k, v)
    if do.dtype is not DType.F32 or do.shape != q.shape[:-1] + (v.shape[-1],):
        raise rules.TypeRuleError(f"grad_out {do} does not match the output of q {q}, v {v}")
    _check_row(lse, q, "logsumexp")
    _check_row(delta, q, "delta (rowsum of grad_out * out)")
    if _check_seed(ins, attrs) == 7:
        _check_mask(ins[6], q, k)
    if attrs.get("stacked", False):
        if not q.shape == k.shape == v.shape:
            raise rules.TypeRuleError(f"stacked gradients need equal shapes, got q {q}, k {k}, v {v}")
        shape = (3, *q.shape)
        perm = attrs.get("perm")
        if perm is not None:
            if sorted(perm) != list(range(len(shape))) or perm[-1] != len(shape) - 1:
                raise rules.TypeRuleError(f"perm {perm} of stacked gradients {shape} must keep the last axis last")
            shape = tuple(shape[p] for p in perm)
        view = attrs.get("shape")
        if view is not None:
            if math.prod(view) != math.prod(shape):
                raise rules.TypeRuleError(f"shape {view} is not a view of stacked gradients {shape}")
            shape = tuple(view)
        return TensorType(shape, DType.F32)
    if attrs.get("perm") is not None:
        raise rules.TypeRuleError("perm applies to stacked gradients only")
    return TensorType((sum(grad_sizes(q.shape, k.shape, v.shape)),), DType.F32)


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, attrs: Attrs) -> torch.Tensor:
    """Scaled, masked scores with K/V heads repeated for grouped queries (torch math)."""
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    if attrs["causal"]:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    return s


def _probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(s - lse); a row that keeps no key (lse = -inf) has probabilities 0, as the kernels."""
    return torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)


def _repeat(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.dim() < 3 or x.shape[-3] == heads else x.repeat_interleave(heads // x.shape[-3], -3)


def dropout_scale(s: torch.Tensor, seed: object, attrs: Attrs) -> torch.Tensor | float:
    """The dropout factor on the probabilities of scores `s`: 1 / (1 - p) where key j of query
    row i is kept (`rng.uniform(seed, stream, .)` at the scores' flat index >= p), else 0; 1.0
    without dropout."""
    p = sdpa_dropout(attrs)
    if not p:
        return 1.0
    keep = uniform(seed, int(attrs["stream"]), s.numel()).view(s.shape) >= p  # type: ignore[arg-type]
    return keep.to(s.dtype) * (1.0 / (1.0 - p))


def _split_seed(rest: tuple[object, ...], attrs: Attrs) -> tuple[tuple[object, ...], object]:
    """(the inputs before the seed, the seed or None); rest ends with attrs."""
    if sdpa_dropout(attrs):
        return rest[:-2], rest[-2]
    return rest[:-1], None


def _lse_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: object) -> torch.Tensor:
    attrs: Attrs = rest[-1]  # type: ignore[assignment]
    ins, seed = _split_seed(rest, attrs)
    mask = ins[0] if len(ins) == 1 else None
    s = _scores(q, k, mask, attrs)  # type: ignore[arg-type]
    lse = torch.logsumexp(s, -1)
    p = _probs(s, lse) * dropout_scale(s, seed, attrs)
    out = p @ _repeat(v, q.shape[-3] if q.dim() >= 3 else 1)
    return torch.cat([out.reshape(-1), lse.reshape(-1)])


def _fold_heads(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of a repeat_interleave over heads: the sum over each group."""
    if g.shape == like.shape:
        return g
    h = like.shape[-3]
    return g.unflatten(-3, (h, g.shape[-3] // h)).sum(-3)


def _bwd_ref(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: object) -> torch.Tensor:
    """dV = P^T dO, dS = P * (dO V^T - delta), dQ = dS K scale, dK = dS^T Q scale (torch math)."""
    attrs: Attrs = rest[-1]  # type: ignore[assignment]
    ins, seed = _split_seed(rest, attrs)
    lse, delta = ins[0], ins[1]
    mask = ins[2] if len(ins) == 3 else None
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    heads = q.shape[-3] if q.dim() >= 3 else 1
    kr, vr = _repeat(k, heads), _repeat(v, heads)
    s = _scores(q, k, mask, attrs)  # type: ignore[arg-type]
    p, z = _probs(s, lse), dropout_scale(s, seed, attrs)  # type: ignore[arg-type]
    dv = (p * z).transpose(-1, -2) @ do
    ds = p * ((do @ vr.transpose(-1, -2)) * z - delta.unsqueeze(-1))  # type: ignore[union-attr]
    dq = (ds @ kr) * scale
    dk = (ds.transpose(-1, -2) @ q) * scale
    flat = torch.cat([dq.reshape(-1), _fold_heads(dk, k).reshape(-1), _fold_heads(dv, v).reshape(-1)])
    if not attrs.get("stacked", False):
        return flat
    stacked = flat.view(3, *q.shape)
    perm, view = attrs.get("perm"), attrs.get("shape")
    out = stacked if perm is None else stacked.permute(*perm).contiguous()
    return out if view is None else out.reshape(view)


def _rows_keys(ins: tuple[TensorType, ...], q: int, k: int) -> tuple[int, int, int, int]:
    qs, ks = ins[q].shape, ins[k].shape
    return math.prod(qs[:-1]), ks[-2], qs[-1], ins[k + 1].shape[-1]


def _lse_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    rows, lk, d, dv = _rows_keys(ins, 0, 1)
    return rows * lk * (2 * d + 2 * dv + 10)


def _bwd_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    # Scores again, dP = dO V^T, dV += P^T dO, dQ += dS K, dK += dS^T Q, and the softmax's pointwise work.
    rows, lk, d, dv = _rows_keys(ins, 1, 2)
    return rows * lk * (6 * d + 4 * dv + 10)


register(
    OpDef(
        Op.SDPA_LSE,
        Kind.CONTRACTION,
        None,
        _lse_infer,
        _lse_ref,
        _lse_flops,
        attrs=_ATTRS,
        doc="inputs (q, k, v[, mask][, seed]), fp32; one flat tensor: SDPA's output, then the logsumexp of "
        "each query row's scaled, masked scores (-inf for a row that keeps no key); optional attrs dropout "
        "(0 < p < 1) and stream, with the i64 seed last: P dropped by vfuse's counter RNG at the scores' "
        "flat index (dropout_scale), the logsumexp that of the undropped scores",
    )
)

register(
    OpDef(
        Op.SDPA_BACKWARD,
        Kind.CONTRACTION,
        None,
        _bwd_infer,
        _bwd_ref,
        _bwd_flops,
        attrs=_ATTRS,
        doc="inputs (grad_out, q, k, v, logsumexp, delta = rowsum(grad_out * out)[, mask][, seed]), fp32; one flat "
        "tensor: dq, dk, dv (K/V gradients summed over the query heads of a group); optional attr "
        "stacked=True: the same bytes as [3, *q.shape] (q, k, v of one shape); with stacked, optional attr "
        "perm: that stack permuted (the last axis stays last), stored in that order; optional attr shape: the "
        "output typed as that reshape of it (the same bytes); optional attrs dropout and stream (the seed last): "
        "the forward's dropout mask, regenerated",
    )
)
