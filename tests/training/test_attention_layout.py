"""The attention backward at the head sizes real models use (32, 64, 80) and lengths that are not a
multiple of its 64-row tiles, with and without causal masking and grouped-query heads, and its stacked
gradients stored in the qkv projection's [B, T, 3, H, D] order (passes/grad_layout.py): gradients of
every parameter against eager, the fold's structure, and no copy of the gradients on their way to the
weight-gradient GEMM and the bias sum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.training.attention_checks import check_attention_grads
from torch import nn

import vfuse
from vfuse.interp import run
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, verify
from vfuse.passes.grad_layout import store_grads_permuted
from vfuse.schedule import BufKind


class _Qkv(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal, self.qkv, self.out = heads, causal, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


# (B, T, heads, head size, causal, threads): T not a multiple of 64; B * heads = 1 < 2 threads splits
# the key tiles into chunks whose dQ parts are summed into the permuted rows.
QKV = [(2, 67, 2, 32, True, 1), (1, 131, 1, 80, False, 2), (3, 29, 3, 64, True, 1)]


@pytest.mark.parametrize(("b", "t", "heads", "hd", "causal", "threads"), QKV)
def test_qkv_attention_gradients_with_the_permuted_store(b, t, heads, hd, causal, threads) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _Qkv(heads * hd, heads, causal), torch.randn(b, t, heads * hd)
    backend = vfuse.backend(strict=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = torch.compile(model, backend=backend)(x)
        grad = torch.randn_like(got)
        got_grads = torch.autograd.grad(got, list(model.parameters()), grad)
    finally:
        torch.set_num_threads(before)
    want = model(x)
    want_grads = torch.autograd.grad(want, list(model.parameters()), grad)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())
    assert not backend.stats["fallbacks"], backend.stats
    compiled = backend.compiled[-1]
    (sdpa,) = [n for n in compiled.executor.graph.nodes if n.op is Op.SDPA_BACKWARD]
    assert sdpa.attrs["perm"] == (1, 3, 0, 2, 4) and sdpa.tensor_type.shape == (b * t, 3 * heads * hd)
    # Nothing the size of the gradients besides the op's own output: its readers take it in place.
    program = compiled.executor.program
    big = [v for v, buf in program.buffers.items() if buf.kind is BufKind.ARENA and buf.type.nbytes >= sdpa.type.nbytes]
    assert big == [sdpa.name], big


# (B, H, HKV, L, head size, causal): head sizes of models, lengths off the tiles, grouped queries.
SDPA = [(2, 4, 2, 67, 32, True), (1, 2, 2, 131, 80, False), (2, 4, 1, 70, 80, True), (1, 2, 2, 65, 64, False)]


@pytest.mark.parametrize(("b", "h", "hkv", "length", "hd", "causal"), SDPA)
def test_attention_gradients_at_model_head_sizes(b, h, hkv, length, hd, causal) -> None:
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    shapes = [(b, h, length, hd), (b, hkv, length, hd), (b, hkv, length, hd)]
    inputs = [torch.randn(s, generator=g).requires_grad_() for s in shapes]

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != hkv)

    backend = vfuse.backend(strict=True)
    check_attention_grads(fn, inputs, backend)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats


def _stacked_backward(extra_reader: bool) -> Graph:
    b = GraphBuilder()
    names = ("do", "q", "k", "v", "lse", "delta")
    shapes = [(2, 3, 5, 4)] * 4 + [(2, 3, 5)] * 2
    do, q, k, v, lse, delta = (
        b.add(Op.INPUT, name=n, index=i, type=TensorType(s, DType.F32)) for i, (n, s) in enumerate(zip(names, shapes))
    )
    attrs = dict(scale=None, causal=False, gqa=False, stacked=True)
    grads = b.add(Op.SDPA_BACKWARD, [do, q, k, v, lse, delta], **attrs)
    perm = b.add(Op.PERMUTE, [grads], perm=(1, 3, 0, 2, 4))
    flat = b.add(Op.RESHAPE, [perm], shape=(10, 36))
    outs = [b.add(Op.SUM, [flat], axes=(0,), keepdim=False)]
    if extra_reader:
        outs.append(b.add(Op.SUM, [grads], axes=(0,), keepdim=False))
    return verify(b.build(outs))


def test_the_permute_and_its_reshapes_fold_into_the_op() -> None:
    before = _stacked_backward(False)
    g = store_grads_permuted(before)
    verify(g)
    # The op's reference stores the permuted stack: the same values as the PERMUTE and RESHAPE read.
    gen = torch.Generator().manual_seed(3)
    ins = [torch.randn(n.tensor_type.shape, generator=gen) for n in before.inputs]
    ins[4] = ins[4].abs() + 2.0  # a logsumexp above every score's exp: probabilities below 1
    torch.testing.assert_close(run(g, ins)[0], run(before, ins)[0], rtol=0, atol=0)
    (op,) = [n for n in g.nodes if n.op is Op.SDPA_BACKWARD]
    assert op.attrs["perm"] == (1, 3, 0, 2, 4) and op.attrs["shape"] == (10, 36) and op.tensor_type.shape == (10, 36)
    assert not [n for n in g.nodes if n.op in (Op.PERMUTE, Op.RESHAPE)]
    assert g[g.outputs[0]].inputs == (op.name,)


def test_a_stack_read_otherwise_keeps_its_layout() -> None:
    g = _stacked_backward(True)
    assert store_grads_permuted(g) is g
