"""What a training step keeps and allocates, bounded by figures of the compiled programs (not
constants): between steps only the forward's pooled outputs no one holds (arenas up to 32 MiB
are freed when a call returns); during a step at most the larger of the forward's and the
backward's arenas besides the loss's own tensors. Outputs held across calls, two forwards
before one backward, and symbolic sizes stay right."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.bench.train import retained_bytes, step_peak_bytes
from vfuse.schedule import BufKind


class _SwiGlu(nn.Module):
    """A LLaMA block's MLP: the backward recomputes silu and keeps gate and up (hf_llama's peak)."""

    def __init__(self, d: int = 61, h: int = 173) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def _step(model: nn.Module, fwd, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in model.parameters():
        p.grad = None
    loss = fwd(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _close(got, want, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _output_bytes(executor) -> int:
    """Bytes of a program's pooled outputs: one buffer each (schedule's Buffer types)."""
    return sum(b.type.nbytes for b in executor.program.buffers.values() if b.kind is BufKind.OUTPUT)


def test_retained_and_step_peak_are_bounded_by_the_programs():
    torch._dynamo.reset()
    x = torch.randn(131, 61)
    eager, model = _SwiGlu(), _SwiGlu()
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    for _ in range(3):
        want, want_grads = _step(eager, eager, x)
        got, got_grads = _step(model, fwd, x)
        _close(got, want, 1e-5, 1e-6)
        for g, w in zip(got_grads, want_grads, strict=True):
            _close(g, w)
    forward, backward = (g.executor for g in backend.compiled)
    # Between steps: no arena (all lent and freed), at most one idle buffer per forward output.
    assert backend.arenas.nbytes() == 0
    kept = retained_bytes(backend)
    assert 0 < kept <= _output_bytes(forward)  # saved activations and the (dropped) user output
    # During a step: the forward's arena is given back before the backward takes its own, the
    # outputs come from the pool and the gradients from donated saved activations or the backward's
    # arena (schedule/donate.py): what a step allocates besides the larger arena is the loss's
    # (out.square(), its gradient; a few scalars) and the copies `_step` makes of the gradients
    # (while the backward's arena, the gradients' storage, is live).
    arenas = [forward.arena_bytes(), backward.arena_bytes()]
    loss_side = 3 * x.nbytes + 4096
    assert min(arenas) > loss_side  # so that holding both at once would fail the bound below
    copies = sum(p.nbytes for p in model.parameters())
    peak = step_peak_bytes(lambda: _step(model, fwd, x))
    assert peak <= max(arenas) + loss_side + copies, (peak, arenas)


def test_two_forwards_before_one_backward():
    """Gradient accumulation: the first forward's saved activations are still held by autograd
    when the second runs, so its pooled buffers must not be reused for the second's."""
    torch._dynamo.reset()
    eager, model = _SwiGlu(), _SwiGlu()
    fwd = torch.compile(model, backend=vfuse.backend(strict=True))
    for step in range(3):
        xs = [torch.randn(131, 61) for _ in range(2)]
        for m, f in ((eager, eager), (model, fwd)):
            for p in m.parameters():
                p.grad = None
            outs = [f(x) for x in xs]
            (outs[0].square().mean() + outs[1].abs().mean() * (step + 1)).backward()
        for a, b in zip(eager.parameters(), model.parameters(), strict=True):
            _close(b.grad, a.grad)


def test_outputs_held_across_calls_keep_their_values():
    """Outputs of several calls kept at once, one of them modified: none is reused while held."""
    torch._dynamo.reset()
    model = _SwiGlu().eval()
    fn = torch.compile(model, backend=vfuse.backend(strict=True))
    xs = [torch.randn(37, 61) for _ in range(4)]
    with torch.no_grad():
        want = [model(x) for x in xs]
        got = [fn(x) for x in xs[:3]]
        got[1].mul_(0)  # the caller's to change: the next call must not see it
        got.append(fn(xs[3]))
        del got[0]  # freed: its buffer may serve the next call
        again = fn(xs[0])
    _close(again, want[0])
    _close(got[0], torch.zeros_like(want[1]))
    for g, w in zip(got[1:], want[2:], strict=True):
        _close(g, w)


def test_symbolic_sizes_grow_one_arena_and_keep_it():
    """Sizes over symbols share one arena, allocated again only for a size needing more than
    any before (issue 15: never per call for a size already seen)."""
    torch._dynamo.reset()
    model = _SwiGlu().eval()
    backend = vfuse.backend(strict=True)
    fn = torch.compile(model, backend=backend, dynamic=True)
    arenas = []
    with torch.no_grad():
        for rows in (37, 131, 37, 131, 64, 131):
            x = torch.randn(rows, 61)
            _close(fn(x), model(x))
            (runner,) = [c.executor for c in backend.compiled if hasattr(c.executor, "_arena_bytes")]
            arenas.append((rows, runner._arena.untyped_storage().data_ptr(), runner._arena_bytes))
    assert len(backend.compiled) == 1  # one program for every size
    grown = {rows: (ptr, size) for rows, ptr, size in arenas[:2]}
    assert grown[131][1] > grown[37][1]  # the larger size grew it
    assert all((ptr, size) == grown[131] for _, ptr, size in arenas[2:])  # then kept
