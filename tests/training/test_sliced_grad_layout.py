"""Separate q, k, v projections (BERT): the attention backward's stacked gradients read through one
SLICE -> RESHAPE -> PERMUTE chain each are stored in the chains' order (passes/grad_layout.py
`_sliced`), so each linear's backward reads its gradient contiguously: gradients against eager at
odd sizes, the rewrite's structure, and the stacks it must leave alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.interp import run
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, verify
from vfuse.passes.grad_layout import store_grads_permuted


class _SeparateQkv(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize(("b", "t", "heads", "hd", "causal"), [(2, 37, 3, 16, False), (1, 67, 2, 32, True)])
def test_separate_qkv_gradients_with_the_sliced_store(b: int, t: int, heads: int, hd: int, causal: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _SeparateQkv(heads * hd, heads, causal), torch.randn(b, t, heads * hd)
    backend = vfuse.backend(strict=True)
    got = torch.compile(model, backend=backend)(x)
    grad = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, list(model.parameters()), grad)
    want = model(x)
    want_grads = torch.autograd.grad(want, list(model.parameters()), grad)
    scale = max(w.abs().max().item() for w in want_grads)  # k's bias gradient is 0 but for rounding
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * max(w.abs().max().item(), 1e-3 * scale))
    assert not backend.stats["fallbacks"], backend.stats
    graph = backend.compiled[-1].executor.graph
    (sdpa,) = [n for n in graph.nodes if n.op is Op.SDPA_BACKWARD]
    assert sdpa.attrs["perm"] == (0, 1, 3, 2, 4) and sdpa.tensor_type.shape == (3, b, t, heads, hd)
    readers = [n for n in graph.nodes if any(graph[i].op is Op.SLICE for i in n.inputs)]
    assert len(readers) == 3 and all(n.op is Op.RESHAPE for n in readers), readers  # no permute left


def _stacked(perms: list[tuple[int, ...]], extra_reader: bool = False) -> Graph:
    b = GraphBuilder()
    shapes = [(2, 3, 5, 4)] * 4 + [(2, 3, 5)] * 2
    ins = [b.add(Op.INPUT, name=f"in{i}", index=i, type=TensorType(s, DType.F32)) for i, s in enumerate(shapes)]
    grads = b.add(Op.SDPA_BACKWARD, ins, scale=None, causal=False, gqa=False, stacked=True)
    outs = []
    for i, perm in enumerate(perms):
        piece = b.add(Op.SLICE, [grads], dim=0, start=i, end=i + 1, step=1)
        view = b.add(Op.RESHAPE, [piece], shape=(2, 3, 5, 4))
        permuted = b.add(Op.PERMUTE, [view], perm=perm)
        flat = b.add(Op.RESHAPE, [permuted], shape=(10, 12) if perm == (0, 2, 1, 3) else (120,))
        outs.append(b.add(Op.SUM, [flat], axes=(0,), keepdim=False))
        if extra_reader and i == 1:
            outs.append(b.add(Op.SUM, [view], axes=(0,), keepdim=False))
    return verify(b.build(outs))


def _inputs(g: Graph) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ins = [torch.randn(n.tensor_type.shape, generator=gen) for n in g.inputs]
    ins[4] = ins[4].abs() + 2.0  # a logsumexp above every score's exp
    return ins


def test_sliced_chains_fold_into_the_ops_order() -> None:
    before = _stacked([(0, 2, 1, 3)] * 3)
    g = store_grads_permuted(before)
    verify(g)
    ins = _inputs(before)
    for got, want in zip(run(g, ins), run(before, ins), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    (op,) = [n for n in g.nodes if n.op is Op.SDPA_BACKWARD]
    assert op.attrs["perm"] == (0, 1, 3, 2, 4) and op.tensor_type.shape == (3, 2, 5, 3, 4)
    assert not [n for n in g.nodes if n.op is Op.PERMUTE]


@pytest.mark.parametrize(
    "perms, extra",
    [
        ([(0, 2, 1, 3), (0, 2, 1, 3), (0, 1, 3, 2)], False),  # one chain moves the head size: not storable
        ([(0, 2, 1, 3), (1, 0, 2, 3), (0, 2, 1, 3)], False),  # the chains disagree
        ([(0, 2, 1, 3)] * 3, True),  # a slice's view also read as it is
    ],
)
def test_stacks_read_otherwise_keep_their_layout(perms: list[tuple[int, ...]], extra: bool) -> None:
    g = _stacked(perms, extra)
    assert store_grads_permuted(g) is g
