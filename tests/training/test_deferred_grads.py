"""Kernels that only write gradients run later in the backward (schedule/donate.defer_outputs), so
that a weight gradient lands in a saved activation the backward has finished reading instead of in
the arena next to the intermediates still to come: gradients as eager's over several steps, the
output projection's weight gradient written after the attention backward and into a donor, no
kernel reading bytes another kernel has written over meanwhile, and the arena no larger than the
intermediates the attention backward needs at once."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tests.models.train_zoo import QkvAttention
from torch import nn

import vfuse
from vfuse.ir import Op
from vfuse.schedule.donate import _align, _written
from vfuse.schedule.kernel import BufKind, ContractionKernel, Segment
from vfuse.schedule.memory import liveness


class _Mlp(nn.Module):
    def __init__(self, d: int = 24, h: int = 97) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.down(F.gelu(self.up(self.norm(x))))
        return x + self.down(F.silu(self.up(self.norm(x))))


def _x(model: nn.Module, step: int) -> torch.Tensor:
    shape = (4, 13, 16) if isinstance(model, QkvAttention) else (31, 24)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(step))


def _train(eager: nn.Module, steps: int = 3):
    """The compiled copy's gradients against eager's, step by step; returns its backend."""
    torch._dynamo.reset()
    model = copy.deepcopy(eager)
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, model)]
    for step in range(steps):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        out = fwd(_x(eager, step))
        kept = out.detach().clone()
        out.square().mean().backward()
        eager(_x(eager, step)).square().mean().backward()
        torch.testing.assert_close(out.detach(), kept, rtol=0, atol=0)  # the user's output untouched
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            err = ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-6)).item()
            assert err < 1e-4, (step, name, err)
        for opt in opts:
            opt.step()
    return backend


def _backward(backend):
    """(graph, program) of the donating backward."""
    found = [(g.graph, g.executor.program) for g in backend.compiled if getattr(g.executor, "program", None)]
    return next((g, p) for g, p in found if p.donated)


def _kernels(program) -> list:
    return [k for s in program.steps if isinstance(s, Segment) for k in s.kernels]


@pytest.mark.parametrize("make", [QkvAttention, _Mlp])
def test_no_kernel_reads_bytes_written_over_since_its_value_was_made(make) -> None:
    torch.manual_seed(0)
    backend = _train(make())
    _, program = _backward(backend)
    offsets = program.memory.offsets

    def span(v: str) -> tuple[int, int]:
        return offsets[v], offsets[v] + _align(program.buffers[v].type.nbytes)

    made: dict[str, int] = {}  # arena value -> position of its last writer
    kernels = _kernels(program)
    for i, k in enumerate(kernels):
        for y in set(k.buffers) - _written(k):
            if y not in offsets:
                continue
            lo, hi = span(y)
            for j in range(made[y] + 1, i):  # nothing between its writer and this read covers it
                for w in _written(kernels[j]) & offsets.keys():
                    a, b = span(w)
                    assert not (a < hi and lo < b), (k.name, y, kernels[j].name, w)
        for w in _written(k) & offsets.keys():
            made[w] = i


def test_output_projection_gradient_lands_in_a_dead_donor() -> None:
    torch.manual_seed(0)
    model = QkvAttention()
    backend = _train(model)
    graph, program = _backward(backend)
    kernels = _kernels(program)
    at = {w: i for i, k in enumerate(kernels) for w in _written(k)}
    sdpa = next(i for i, k in enumerate(kernels) if isinstance(k, ContractionKernel) and k.op is Op.SDPA_BACKWARD)
    weight = [v for v, b in program.buffers.items() if b.kind is BufKind.OUTPUT and b.type.shape == (16, 16)]
    assert len(weight) == 1 and at[weight[0]] > sdpa, (weight, at, sdpa)
    assert weight[0] in {v for v, _, _ in program.donated}
    assert not program.arena_outputs  # every gradient in the saved activations' dead bytes
    # The arena holds only what the attention backward needs at once.
    live = liveness(graph, list(program.steps), set(program.memory.offsets))
    need = sum(_align(program.buffers[v].type.nbytes) for v, (a, b) in live.items() if a <= sdpa <= b)
    assert program.memory.size <= need, (program.memory.size, need)
