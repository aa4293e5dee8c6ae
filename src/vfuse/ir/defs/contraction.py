"""Contractions: batched matmul, 2-D convolution, and scaled-dot-product attention.

SDPA is one op rather than its decomposition because its fused form (online softmax over
K/V tiles) is a template, not something the pointwise planner can rediscover; the
attention rewrite pass turns hand-written spellings into this same op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vfuse.ir import shapes
from vfuse.ir.defs import rules
from vfuse.ir.defs.rng import uniform
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type


def _same_float(ins: tuple[TensorType, ...]) -> DType:
    dtypes = {t.dtype for t in ins}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_float:
        raise rules.TypeRuleError(f"operands must share one float dtype, got {[str(t) for t in ins]}")
    return dtypes.pop()


def _matmul_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return TensorType(shapes.matmul(ins[0].shape, ins[1].shape), _same_float(ins))


def _matmul_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    return 2 * out.numel * ins[0].shape[-1]


register(
    OpDef(
        Op.MATMUL,
        Kind.CONTRACTION,
        2,
        _matmul_infer,
        lambda a, b, attrs: torch.matmul(a, b),
        _matmul_flops,
        doc="rank >= 2 operands, batch dims broadcast (the frontend reshapes 1-D operands)",
    )
)


def _conv_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    x, w = ins
    shape = shapes.conv2d(x.shape, w.shape, attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"])
    return TensorType(shape, _same_float(ins))


def _conv_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    w = ins[1].shape
    return 2 * out.numel * w[1] * w[2] * w[3]


def _conv_ref(x: torch.Tensor, w: torch.Tensor, attrs: Attrs) -> torch.Tensor:
    # Contiguous operands: oneDNN runs a permuted or flipped weight view (convolution_backward's
    # grad_input weight) ~8x slower than the same weight copied (2x256x8x8, 3x3, one thread).
    return F.conv2d(
        x.contiguous(), w.contiguous(), None, attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"]
    )


register(
    OpDef(
        Op.CONV2D,
        Kind.CONTRACTION,
        2,
        _conv_infer,
        _conv_ref,
        _conv_flops,
        attrs=("stride", "padding", "dilation", "groups"),
        doc="NCHW input, OIHW weight, no bias (the frontend adds bias as a broadcast ADD)",
    )
)


def sdpa_dropout(attrs: Attrs) -> float:
    """The dropout probability on P (optional attr `dropout`, with `stream`: 0 without dropout).
    With dropout the SDPA's last input is the RNG seed; key j of query row i is kept when
    `rng.uniform(seed, stream, .)` at the scores' flat index ((batch, i) * Lk + j) is >= p,
    exactly the mask of the decomposed RAND >= p it replaces (passes/attention.py)."""
    return float(attrs.get("dropout", 0.0))


def sdpa_has_mask(n_inputs: int, attrs: Attrs) -> bool:
    """Inputs are (q, k, v[, mask][, seed]): the seed only with dropout."""
    return n_inputs - (1 if sdpa_dropout(attrs) else 0) == 4


def _sdpa_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    q, k, v = ins[:3]
    dtype = _same_float((q, k, v))
    if q.rank < 2 or k.shape[-1] != q.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise rules.TypeRuleError(f"attention shapes do not agree: q {q}, k {k}, v {v}")
    if sdpa_dropout(attrs) and (ins[-1].dtype is not DType.I64 or ins[-1].shape != ()):
        raise rules.TypeRuleError(f"attention dropout needs an i64 seed as its last input, got {ins[-1]}")
    if sdpa_has_mask(len(ins), attrs):
        scores = q.shape[:-1] + (k.shape[-2],)
        if shapes.broadcast(ins[3].shape, scores) != scores:
            raise rules.TypeRuleError(f"mask {ins[3]} does not broadcast to scores {scores}")
    return TensorType(q.shape[:-1] + (v.shape[-1],), dtype)


def _sdpa_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: object) -> torch.Tensor:
    attrs = rest[-1]
    mask = rest[0] if sdpa_has_mask(len(rest) + 2, attrs) else None  # type: ignore[arg-type]
    if sdpa_dropout(attrs):
        return _sdpa_dropout_ref(q, k, v, mask, rest[-2], attrs)  # type: ignore[arg-type]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=attrs["causal"], scale=attrs["scale"], enable_gqa=attrs["gqa"]
    )


def _sdpa_dropout_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, seed: torch.Tensor, attrs: Attrs
) -> torch.Tensor:
    """Softmax(q k^T * scale + mask) with vfuse's dropout mask on P, then P v (torch's math path;
    a row with every key masked gives 0, as torch's)."""
    if attrs["gqa"] and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if attrs["causal"]:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.float()
    p = torch.softmax(s, -1).nan_to_num(0.0)
    keep = uniform(seed, int(attrs["stream"]), s.numel()).view(s.shape) >= sdpa_dropout(attrs)
    rate = sdpa_dropout(attrs)
    p = p * keep * (0.0 if rate == 1.0 else 1.0 / (1.0 - rate))
    return (p @ v.float()).to(q.dtype)


def _sdpa_flops(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    q, k = ins[0].shape, ins[1].shape
    rows, lk = math.prod(q[:-1]), k[-2]
    return rows * lk * (2 * q[-1] + 2 * ins[2].shape[-1] + 10)


register(
    OpDef(
        Op.SDPA,
        Kind.CONTRACTION,
        None,
        _sdpa_infer,
        _sdpa_ref,
        _sdpa_flops,
        attrs=("scale", "causal", "gqa"),
        doc="inputs (q, k, v[, mask][, seed]); mask is additive (float) or keep-mask (bool); "
        "scale None means 1/sqrt(head_dim); gqa lets k/v have fewer heads; optional dropout "
        "(with stream and the RNG seed as last input): vfuse's counter-based mask on P",
    )
)
