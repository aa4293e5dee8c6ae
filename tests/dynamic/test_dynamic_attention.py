"""Written-out attention (HF eager's `softmax(q @ k.T / sqrt(d) + mask) @ v` and its relatives)
under torch.compile(dynamic=True): compiled once over the batch and sequence length, rewritten
into one SDPA (passes/attention.py: no softmax left in the graph) at every length, and equal to
eager at primes, 2 and lengths past a tile."""

from __future__ import annotations

import math

import pytest
import torch

import vfuse
from vfuse.ir.ops import Op
from vfuse.runtime.symbolic import SymbolicExecutor

H, D = 2, 16
LENGTHS = (5, 2, 7, 33, 64, 131)


class _Attention(torch.nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.out = torch.nn.Linear(H * D, H * D)
        self.register_buffer("bias", torch.tril(torch.ones(256, 256, dtype=torch.bool)).view(1, 1, 256, 256))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.form == "hf_padding":  # HF eager: a (b, 1, 1, t) additive mask, softmax in fp32
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D) + mask
            w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        elif self.form == "gpt2_causal":  # GPT-2: a slice of a causal buffer through torch.where
            w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
            low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
            w = torch.where(self.bias[:, :, :t, :t], w, low).softmax(-1)
        else:  # a (t, t) mask through masked_fill, the scale multiplied into q
            w = ((q * D**-0.5) @ k.transpose(-1, -2)).masked_fill(mask == 0, float("-inf")).softmax(-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, t, c))


def _mask(form: str, b: int, t: int) -> torch.Tensor:
    if form == "hf_padding":
        m = torch.zeros(b, 1, 1, t)
        m[0, ..., t // 2 :] = torch.finfo(torch.float32).min  # the first sequence is padded
        return m
    return torch.tril(torch.ones(t, t))


@pytest.mark.parametrize("form", ["hf_padding", "gpt2_causal", "masked_fill"])
def test_written_out_attention_compiles_once_as_sdpa_for_every_length(form: str, rendered: list) -> None:
    torch.manual_seed(0)
    model = _Attention(form).eval()
    backend = vfuse.backend(strict=True)
    fn = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for t in LENGTHS:
            x = torch.randn(2, t, H * D)
            torch.testing.assert_close(fn(x, _mask(form, 2, t)), model(x, _mask(form, 2, t)), rtol=1e-4, atol=1e-5)
    assert len(rendered) == 1 and backend.stats["eager_graphs"] == 0  # one program for every length
    (compiled,) = backend.compiled
    assert isinstance(compiled.executor, SymbolicExecutor)
    ops = {n.op for n in compiled.graph.nodes}
    assert Op.SDPA in ops and Op.EXP not in ops, sorted(map(str, ops))  # rewritten: no softmax left
