"""schedule/memory.reuse_in_place: a plain kernel storing an arena value elementwise over one it
reads for the last time takes that value's bytes (one pointer for both); a kernel reading the
dying value at other elements does not. Gradients and outputs against eager at odd sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.models.train_zoo import fix_typical_target
from torch import nn

import vfuse
from vfuse.schedule import BufKind, Program, Segment
from vfuse.schedule.kernel import Kernel, Load, Store


def _reused(program: Program) -> list[tuple[str, str]]:
    """(stored value, value whose bytes it took) where a kernel stores into a buffer of another
    name that shares the offset."""
    arena = {v: b.slot for v, b in program.buffers.items() if b.kind is BufKind.ARENA}
    out = []
    for s in program.steps:
        if not isinstance(s, Segment):
            continue
        for k in s.kernels:
            if not isinstance(k, Kernel):
                continue
            stmts = [st for p in k.passes for st in (*p.before, *p.body)]
            loads = {st.buf for st in stmts if isinstance(st, Load)}
            for st in stmts:
                if isinstance(st, Store) and st.buf in loads and st.buf in arena:
                    out += [(v, st.buf) for v, o in arena.items() if o == arena[st.buf] and v != st.buf]
    return out


class _SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def test_swiglu_backward_reuses_a_dying_buffer_and_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward's d(silu * up) = g @ W_down is read by one elementwise kernel that writes
    both d_up and d_gate: one of them takes its bytes (what the backward holds is the cut's choice)."""
    fix_typical_target(monkeypatch)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _SwiGLU(37, 131)
    x = torch.randn(3, 41, 37, requires_grad=True)
    backend = vfuse.backend(strict=True)
    got = torch.compile(model, backend=backend)(x)
    grad = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, [x, *model.parameters()], grad)
    want_grads = torch.autograd.grad(model(x), [x, *model.parameters()], grad)
    for a, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())
    program = backend.compiled[-1].executor.program
    # Since GEMM epilogues store several outputs (ContractionKernel.stores), g = dY @ W_down is
    # not stored at all: its GEMM writes d_up and d_gate from the tile. Either way, no buffer of g.
    gemm_writes_both = any(len(getattr(k, "written", ())) > 1 for s in program.steps for k in getattr(s, "kernels", ()))
    assert _reused(program) or gemm_writes_both, "no kernel stored over the buffer it read last"
    assert program.memory.size < program.memory.naive_bytes


def test_reads_of_other_elements_keep_their_own_buffer() -> None:
    """b = tanh(h * roll(h, 1)) + exp(h) with h = x @ w: the kernel reads h one column back, so
    storing b over h would read an element it already overwrote; b keeps its own buffer."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    x, w, w2 = torch.randn(29, 53), torch.randn(53, 67), torch.randn(67, 19)

    def f(x: torch.Tensor, w: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ w
        b = torch.tanh(h * torch.cat([h[:, -1:], h[:, :-1]], 1)) + torch.exp(h)
        return b @ w2, b @ w2.t().contiguous().t()  # two GEMMs: b is stored, not a prologue

    backend = vfuse.backend(strict=True)
    got = torch.compile(f, backend=backend)(x, w, w2)
    for a, e in zip(got, f(x, w, w2), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    program = backend.compiled[-1].executor.program
    assert set(program.memory.offsets) == {"mm", "add"}, program.memory  # b is written by a kernel
    assert not _reused(program)
    assert program.memory.offsets["mm"] != program.memory.offsets["add"]


def test_pointwise_kernel_stores_over_the_product_it_reads_last() -> None:
    """b = tanh(h - colsum(h)) + exp(h) with h = x @ w: the column sum needs all of h first, so
    h is stored; b's kernel reads h at its own index for the last time and takes h's bytes."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    x, w, w2 = torch.randn(29, 53), torch.randn(53, 67), torch.randn(67, 19)

    def f(x: torch.Tensor, w: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ w
        b = torch.tanh(h - h.sum(0, keepdim=True)) + torch.exp(h)
        return b @ w2, b @ w2.t().contiguous().t()  # two GEMMs: b is stored, not a prologue

    backend = vfuse.backend(strict=True)
    got = torch.compile(f, backend=backend)(x, w, w2)
    for a, e in zip(got, f(x, w, w2), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    assert _reused(backend.compiled[-1].executor.program), "b did not take the bytes of h"


def test_a_reshaped_value_takes_the_bytes_of_one_it_reads_last() -> None:
    """The same with h viewed 3-D and b stored 2-D (SwiGLU's backward stores d_gate [123, 131]
    over g [3, 41, 131]): one dtype and size, the same flat index, so b still takes h's bytes."""
    torch._dynamo.reset()
    torch.manual_seed(3)
    x, w, w2 = torch.randn(3, 29, 53), torch.randn(53, 67), torch.randn(67, 19)

    def f(x: torch.Tensor, w: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ w
        b = (torch.tanh(h - h.sum((0, 1), keepdim=True)) + torch.exp(h)).reshape(87, 67)
        return b @ w2, b @ w2.t().contiguous().t()

    backend = vfuse.backend(strict=True)
    got = torch.compile(f, backend=backend)(x, w, w2)
    for a, e in zip(got, f(x, w, w2), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    program = backend.compiled[-1].executor.program
    graph = backend.compiled[-1].graph
    pairs = _reused(program)
    assert pairs, "b did not take the bytes of h"
    assert any(graph[v].tensor_type.shape != graph[d].tensor_type.shape for v, d in pairs), pairs
