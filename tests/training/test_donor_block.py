"""The forward's donated saved activations in one block (runtime/pool.OutputPool.group), so that a
gradient larger than any one of them is stored across adjacent ones the backward has finished
reading (schedule/donate.py): gradients as eager's over several steps, the planned bytes really
used at run time, a block that does not match the plan refused, and a lower step peak."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.bench.train import pool_pointers, pooled_grad_bytes, retained_bytes, step_peak_bytes
from vfuse.runtime.pool import BLOCK_KEY, OutputPool, donated_views


class _Stack(nn.Module):
    """MLP blocks over few tokens: each weight gradient (d x h) is larger than any one saved
    activation (tokens x h at most), as in hf_vit's MLPs."""

    def __init__(self, d: int = 24, h: int = 97, depth: int = 3) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Linear(d, h) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(h, d) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(F.gelu(up(norm(x))))
        return x


def _x(step: int = 0) -> torch.Tensor:
    return torch.randn(13, 24, generator=torch.Generator().manual_seed(step))


def _spanning(program) -> list[tuple[str, str, int]]:
    """Donations that run past their donor's end (into the next donors of the block)."""
    sizes = {x: program.buffers[x].type.nbytes for x, _ in program.donor_block if x in program.buffers}
    return [(v, x, o) for v, x, o in program.donated if o + program.buffers[v].type.nbytes > sizes.get(x, 0)]


def _compiled(model: nn.Module):
    backend = vfuse.backend(strict=True)
    return torch.compile(model, backend=backend), backend


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_across_donors_match_eager(set_to_none: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _Stack()
    model = copy.deepcopy(eager)
    fwd, backend = _compiled(model)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_m = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        opt_e.zero_grad(set_to_none=set_to_none)
        opt_m.zero_grad(set_to_none=set_to_none)
        out = fwd(_x(step))
        kept = out.detach().clone()
        out.square().mean().backward()
        eager(_x(step)).square().mean().backward()
        torch.testing.assert_close(out.detach(), kept, rtol=0, atol=0)  # the user's output untouched
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            err = ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-6)).item()
            assert err < 1e-4, (step, name, err)
        opt_e.step()
        opt_m.step()
    forward, backward = (g.executor for g in backend.compiled[:2])
    spans = _spanning(backward.program)
    assert spans, backward.program.donated  # what this test is about
    if set_to_none:  # the spanning gradients are views of the forward's block at run time
        ptrs = {slot[3] for slot in forward._pool._slots[BLOCK_KEY]}
        grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
        assert ptrs & grads, (ptrs, grads)


def test_accumulated_gradients_match_eager() -> None:
    """Two forwards before their backwards: the second forward's block is another (the first's
    members are still saved for its backward)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _Stack()
    model = copy.deepcopy(eager)
    fwd, _ = _compiled(model)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        losses = [fwd(_x(step * 2 + k)).square().mean() for k in range(2)]
        for loss in losses:
            loss.backward()
        for k in range(2):
            eager(_x(step * 2 + k)).square().mean().backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_a_block_unlike_the_plan_is_refused() -> None:
    """Offsets past a donor's end are used only on the forward's block as planned: the same
    bytes, each donor at its offset, no other input on the storage."""
    block = torch.zeros(192, dtype=torch.uint8).untyped_storage()

    def on(start: int, n: int) -> torch.Tensor:
        return torch.empty(0).set_(block, start // 4, (n // 4,))

    a, b = on(0, 40), on(64, 64)  # a's 40 bytes, padding to 64, then b's
    layout, wanted = [("a", 0), ("b", 64)], [("g", (24,), torch.float32)]  # g: 96 bytes over a and b
    views = donated_views([("g", "a", 0)], wanted, {"a": a, "b": b}, [a, b], layout, 192)
    assert views["g"].data_ptr() == a.data_ptr() and views["g"].shape == (24,)
    # without the block, or a block of other bytes, or another input on it: refused
    assert donated_views([("g", "a", 0)], wanted, {"a": a, "b": b}, [a, b]) == {}
    assert donated_views([("g", "a", 0)], wanted, {"a": a, "b": b}, [a, b], layout, 256) == {}
    other = on(128, 64)
    assert donated_views([("g", "a", 0)], wanted, {"a": a, "b": b}, [a, b, other], layout, 192) == {}
    assert donated_views([("g", "a", 0)], wanted, {"a": a, "b": on(128, 64)}, [a, b], layout, 192) == {}
    # a donation within one donor needs no block
    small = [("h", (8,), torch.float32)]
    assert donated_views([("h", "b", 0)], small, {"b": b.clone()}, [b.clone()])["h"].shape == (8,)


def test_pool_hands_each_member_out_once_per_block() -> None:
    """Members asked for one by one (the general path) come from one block per call; a member asked
    for again starts another block while the first is held, and the first is reused once free."""
    pool = OutputPool()
    pool.group([("a", (3,), torch.float32), ("b", (5, 2), torch.float32)])
    a1, b1 = pool.get("a", (3,), torch.float32), pool.get("b", (5, 2), torch.float32)
    assert a1.untyped_storage().data_ptr() == b1.untyped_storage().data_ptr()
    assert b1.data_ptr() - a1.data_ptr() == 64
    a2 = pool.get("a", (3,), torch.float32)
    assert a2.untyped_storage().data_ptr() != a1.untyped_storage().data_ptr()
    first = a1.untyped_storage().data_ptr()
    del a1, b1
    pool.get("b", (5, 2), torch.float32)  # completes the second block's call
    assert pool.get("a", (3,), torch.float32).untyped_storage().data_ptr() == first
    assert pool.get("c", (2,), torch.float32).untyped_storage().data_ptr() != first  # not a member


def _bench_peak(model: nn.Module, fwd, backend) -> int:
    """The bench's peak of one step (bench/train._finish): allocated in the step + retained + the
    gradients in pool buffers from before the step."""
    x = _x()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        fwd(x).square().mean().backward()

    for _ in range(3):
        step()
    before = pool_pointers(backend)
    peak = step_peak_bytes(step)
    return peak + retained_bytes(backend) + pooled_grad_bytes(model, before)


def test_the_block_lowers_the_step_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the block (each saved activation in a buffer of its own) the gradients planned
    across donors take fresh buffers; with it they cost nothing."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Stack()
    fwd, backend = _compiled(model)
    with_block = _bench_peak(model, fwd, backend)
    spans = _spanning(backend.compiled[1].executor.program)
    torch._dynamo.reset()
    plain = copy.deepcopy(model)
    monkeypatch.setattr(OutputPool, "group", lambda self, members: None)
    fwd2, backend2 = _compiled(plain)
    without = _bench_peak(plain, fwd2, backend2)
    spanned = sum(backend.compiled[1].executor.program.buffers[v].type.nbytes for v, _, _ in spans)
    assert with_block + spanned // 2 <= without, (with_block, without, spanned)
