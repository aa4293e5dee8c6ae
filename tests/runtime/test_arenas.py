"""Arenas lent to a backend's graphs in turn (runtime/arenas.py) and what a training step keeps
between steps: one arena for forward and backward, saved inputs not copied."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import vfuse
from vfuse.bench.train import retained_bytes
from vfuse.runtime.arena_outputs import ArenaOutputExecutor
from vfuse.runtime.arenas import LEND_MIN_BYTES, RELEASE_MAX_BYTES, ArenaLender
from vfuse.runtime.pool import is_idle


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(61), nn.Linear(61, 257), nn.GELU(), nn.Linear(257, 61))


def _step(model: nn.Module, fwd, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in model.parameters():
        p.grad = None
    loss = fwd(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _arenas(backend) -> dict[int, int]:
    """Distinct arena storages of the backend's graphs: data pointer -> bytes."""
    out = {}
    for g in backend.compiled:
        a = g.executor._arena
        if a is not None:
            out[a.untyped_storage().data_ptr()] = a.numel()
    return out


def test_training_graphs_share_one_arena_and_match_eager():
    """Arenas held between calls (release_max=0): the forward borrows one; the backward's arena
    holds its gradients (runtime/arena_outputs.py), so it is the gradients' own, never lent."""
    torch._dynamo.reset()
    x = torch.randn(509, 61)
    eager = _mlp()
    model = _mlp()
    backend = vfuse.backend(strict=True)
    backend.arenas = ArenaLender(release_max=0)
    fwd = torch.compile(model, backend=backend)
    for i in range(3):  # the steady state: the second and third steps reuse what the first made
        want, want_grads = _step(eager, eager, x)
        got, got_grads = _step(model, fwd, x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        if i == 0:  # the forward's, then the backward's if that needs more: grown once
            first_step = backend.arenas.allocated
    executors = [g.executor for g in backend.compiled]
    lent = [ex for ex in executors if ex._lender is backend.arenas]
    assert len(lent) == 1 and isinstance(executors[1], ArenaOutputExecutor)
    needs = [ex.arena_bytes() for ex in lent]
    assert min(needs) >= LEND_MIN_BYTES
    assert list(_arenas(backend).values()) == [max(needs)]
    assert first_step <= 1 and backend.arenas.allocated == first_step
    # Between steps: that arena and the forward's pooled outputs no one holds (the saved
    # activations autograd freed); the backward's arena is the parameters' .grad.
    fwd_ex = lent[0]
    idle = sum(ring[0][1].nbytes() for ring in fwd_ex._pool._slots.values() if is_idle(ring[0]))
    assert all(len(ring) == 1 for ex in executors for ring in ex._pool._slots.values())
    assert retained_bytes(backend) == max(needs) + idle


def test_small_arenas_are_freed_between_calls():
    """The default lender frees arenas up to RELEASE_MAX_BYTES when a call returns: between
    steps the backend keeps only the forward's idle pool buffers; results stay right, over
    steps that allocate the arena again each call."""
    torch._dynamo.reset()
    x = torch.randn(509, 61)
    eager, model = _mlp(), _mlp()
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    for _ in range(3):
        want, want_grads = _step(eager, eager, x)
        got, got_grads = _step(model, fwd, x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    lent = [g.executor for g in backend.compiled if g.executor._lender is backend.arenas]
    assert len(lent) == 1 and all(
        ex.arena_bytes() <= RELEASE_MAX_BYTES for ex in lent
    )  # the backward's: its gradients'
    assert all(ex._arena is None or ex._arena.untyped_storage().nbytes() == 0 for ex in lent)
    assert backend.arenas.allocated == 0 and backend.arenas.released >= 3  # a forward per step
    idle = sum(ring[0][1].nbytes() for ring in lent[0]._pool._slots.values() if is_idle(ring[0]))
    assert retained_bytes(backend) == idle


def test_lender_frees_small_arenas_and_holds_large_ones():
    lender = ArenaLender(release_max=1000)
    small = lender.take(500)
    small[:] = 7
    lender.give(small)
    assert small.untyped_storage().nbytes() == 0 and lender.nbytes() == 0 and lender.released == 1
    again = lender.take(500)
    assert again is not small and again.untyped_storage().nbytes() >= 500  # a new object: borrowers rebind
    big = lender.take(5000)
    lender.give(big)
    assert lender.take(4000) is big and lender.allocated == 1


def test_training_forward_saves_weights_without_copying_them():
    torch._dynamo.reset()
    model = _mlp()
    fwd = torch.compile(model, backend=vfuse.backend(strict=True))
    x = torch.randn(509, 61)
    _step(model, fwd, x)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fwd(x).square().mean()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters() if p.dim() == 2}
    assert weights <= set(saved)  # the parameters themselves, not per-step copies
    loss.backward()


def test_lender_gives_overlapping_calls_their_own_arena():
    lender = ArenaLender(release_max=0)
    a = lender.take(100)
    b = lender.take(50)  # a is still lent out: a second arena
    assert a.data_ptr() != b.data_ptr() and a.numel() >= 100 and b.numel() >= 50
    lender.give(b)
    lender.give(a)
    assert lender.take(80) is a  # the largest first
    small = lender.take(10)
    assert small is b
    lender.give(small)
    c = lender.take(200)  # b is too small: dropped, a new one
    assert c.numel() >= 200 and lender.allocated == 3
    assert lender.nbytes() == 0


@pytest.mark.parametrize("release_max", [0, RELEASE_MAX_BYTES])
def test_threads_running_one_backends_graphs_at_once(release_max: int):
    """Two graphs of one backend called from two threads at once: overlapping calls each get an
    arena of their own (held ones, or each a new one when freed after every call), and every
    result is right."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    backend.arenas = ArenaLender(release_max)
    models = [_mlp(), nn.Sequential(nn.Linear(61, 263), nn.ReLU(), nn.Linear(263, 7))]
    fns = [torch.compile(m, backend=backend) for m in models]
    x = torch.randn(509, 61)
    with torch.no_grad():
        want = [m(x) for m in models]
        for f in fns:
            f(x)
    assert sum(1 for g in backend.compiled if g.executor._lender is not None) == 2
    errors: list[BaseException] = []

    def work(f, w: torch.Tensor) -> None:
        try:
            for _ in range(30):
                with torch.no_grad():
                    torch.testing.assert_close(f(x), w, rtol=1e-5, atol=1e-5)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f, w)) for f, w in zip(fns * 2, want * 2, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    if release_max:
        assert backend.arenas.allocated == 0 and backend.arenas.released >= 4 * 30
    else:
        assert 1 <= backend.arenas.allocated <= 4


class _ReturnsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 5, 3, padding=1), nn.BatchNorm2d(5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, torch.relu(self.bn(self.conv(x)))


def test_saved_inputs_returned_as_is_keep_eager_semantics():
    """A user output that is the input itself, and BatchNorm's running statistics (updated in
    place after the forward, and saved by it): results, gradients and statistics as eager's."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    eager = _ReturnsInput().train()
    model = _ReturnsInput().train()
    model.load_state_dict(eager.state_dict())
    fwd = torch.compile(model, backend=vfuse.backend(strict=True))
    for _ in range(3):
        x = torch.randn(2, 3, 7, 11)
        xe, xv = x.clone().requires_grad_(), x.clone().requires_grad_()
        (ye, oe), (yv, ov) = eager(xe), fwd(xv)
        torch.testing.assert_close(yv, x)
        ((oe * 3).sum() + ye.square().sum()).backward()
        ((ov * 3).sum() + yv.square().sum()).backward()
        torch.testing.assert_close(ov, oe, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xv.grad, xe.grad, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(eager.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    for a, b in zip(eager.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-4)


def test_backward_with_gradients_in_its_arena_takes_the_lean_path():
    """The backward's gradients are views of a fresh arena each call, bound by the lean call
    path: a gradient held from one step keeps its values through the next step's call. (The
    MLP's backward stores gradients into donated saved activations: the general path.)"""
    torch._dynamo.reset()
    x = torch.randn(7, 61)

    def _norm() -> nn.Module:
        torch.manual_seed(0)
        return nn.LayerNorm(61)

    eager, model = _norm(), _norm()
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    _, first = _step(model, fwd, x)
    held = [p.grad for p in model.parameters()]  # the arena's own views, not copies
    bwd = backend.compiled[1].executor
    assert isinstance(bwd, ArenaOutputExecutor) and bwd.call_plan is not None and bwd.program.arena_outputs
    placed = {a.untyped_storage().data_ptr() for a in held}
    _, second = _step(model, fwd, x * 2)
    want = _step(eager, eager, x * 2)[1]
    for h, f, s, w in zip(held, first, second, want, strict=True):
        assert torch.equal(h, f)
        torch.testing.assert_close(s, w, rtol=1e-4, atol=1e-5)
    again = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(placed) < len(held) and not placed & again  # shared by a call's gradients, fresh per call
