"""`vfuse::flash_attention_dropout` and its backward: training attention with dropout on P, as two
torch ops that vfuse lowers to its flash templates (SDPA_LSE / SDPA_BACKWARD with attr dropout).

torch's CPU flash attention has no dropout, so `F.scaled_dot_product_attention(dropout_p > 0)` in
training takes torch's math path: the N x N probabilities and the mask are kept for the backward.
entry/attention_rewrite.py puts these ops in its place (and in that of written-out
`softmax -> dropout -> @ v`) before AOTAutograd: their autograd formula saves q, k, v, the output,
the logsumexp and an 8-byte seed (O(N)); the mask is a pure function of (seed, stream, the scores'
flat index), vfuse's counter RNG (ir/defs/rng.py), which the backward kernel draws again.

Eagerly (a graph vfuse does not compile) they run the IR ops' torch references
(ir/defs/attention_grad.py): the same mask bits, with the scores materialized.
"""

from __future__ import annotations

import math

import torch

from vfuse.ir import Op
from vfuse.ir.defs.attention_grad import grad_sizes, lse_sizes
from vfuse.ir.opdefs import opdef
from vfuse.ir.ops import Attrs

Tensor = torch.Tensor


def attrs(q: Tensor, k: Tensor, p: float, causal: bool, scale: float | None, stream: int) -> Attrs:
    """The IR attributes of the op pair (gqa when k has fewer heads)."""
    gqa = q.dim() >= 3 and q.shape[-3] != k.shape[-3]
    return Attrs.of(scale=scale, causal=causal, gqa=gqa, dropout=p, stream=stream)


def _pieces(flat: Tensor, shapes: list[tuple[int, ...]], sizes: tuple[int, ...]) -> tuple[Tensor, ...]:
    # Separate tensors: a custom op's outputs may not alias each other.
    return tuple(x.reshape(s).clone() for x, s in zip(flat.split(list(sizes)), shapes, strict=True))


@torch.library.custom_op("vfuse::flash_attention_dropout", mutates_args=())
def flash_attention_dropout(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    seed: Tensor,
    p: float,
    causal: bool,
    scale: float | None,
    stream: int,
) -> tuple[Tensor, Tensor]:
    """(out, logsumexp): softmax(q k^T scale [+ mask], causal) with vfuse's dropout mask, times v."""
    ins = [q.contiguous(), k.contiguous(), v.contiguous(), *([] if mask is None else [mask]), seed]
    flat = opdef(Op.SDPA_LSE).ref(*ins, attrs(q, k, p, causal, scale, stream))
    qs, vs = tuple(q.shape), tuple(v.shape)
    out, lse = _pieces(flat, [qs[:-1] + vs[-1:], qs[:-1]], lse_sizes(qs, vs))
    return out, lse


@flash_attention_dropout.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, *rest: object) -> tuple[Tensor, Tensor]:
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1])


@torch.library.custom_op("vfuse::flash_attention_dropout_backward", mutates_args=())
def flash_attention_dropout_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    seed: Tensor,
    p: float,
    causal: bool,
    scale: float | None,
    stream: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), the forward's mask regenerated from the seed."""
    do = grad_out.contiguous()
    delta = (do * out).sum(-1)
    ins = [do, q.contiguous(), k.contiguous(), v.contiguous(), lse, delta, *([] if mask is None else [mask]), seed]
    flat = opdef(Op.SDPA_BACKWARD).ref(*ins, attrs(q, k, p, causal, scale, stream))
    shapes = [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    dq, dk, dv = _pieces(flat, shapes, grad_sizes(*shapes))
    return dq, dk, dv


@flash_attention_dropout_backward.register_fake
def _(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, *rest: object) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    q, k, v, mask, seed, p, causal, scale, stream = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, mask, seed)  # O(N): no N x N tensor, the mask is re-drawn
    ctx.args = (p, causal, scale, stream)


def _backward(ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple:
    q, k, v, out, lse, mask, seed = ctx.saved_tensors
    dq, dk, dv = flash_attention_dropout_backward(grad_out, q, k, v, out, lse, mask, seed, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


flash_attention_dropout.register_autograd(_backward, setup_context=_setup_context)


def _flops(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], backward: bool) -> int:
    """Matmul flops over the rows x keys scores: forward S = Q K^T and P V (2 D + 2 Dv per score);
    backward S again, dV, dP, dQ and dK (6 D + 4 Dv)."""
    d, dv = q[-1], v[-1]
    return math.prod(q[:-1]) * k[-2] * ((6 * d + 4 * dv) if backward else (2 * d + 2 * dv))


def _forward_flops(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], *args: object, **kwargs: object) -> int:
    return _flops(q, k, v, backward=False)


def _backward_flops(grad_out: tuple[int, ...], q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                    *args: object, **kwargs: object) -> int:  # fmt: skip
    return _flops(q, k, v, backward=True)


def register_flops() -> None:
    """A flop formula makes the op pair a contraction for the save-or-recompute cut (entry/remat.py,
    which calls this): kept, never run again in the backward. Not at import: torch.utils.flop_counter
    imports triton where it is installed, and the CPU path must not (tests/triton/test_backend.py)."""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    for op, formula in ((torch.ops.vfuse.flash_attention_dropout, _forward_flops),
                        (torch.ops.vfuse.flash_attention_dropout_backward, _backward_flops)):  # fmt: skip
        if op not in flop_registry:
            register_flop_formula(op)(formula)
