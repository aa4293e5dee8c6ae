"""Gradients stored into the backward's donated saved activations (schedule/donate.py): the same
gradients as eager over several steps (zero_grad to None or to zeros, a gradient accumulation step,
the optimizer stepping in between), no gradient stored over bytes a later kernel still reads, and the
forward's outputs that torch's trace saw as two tensors but vfuse returns as one never donated."""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.entry.outputs import COMPUTED, check_donated, donated_inputs
from vfuse.runtime.arena_outputs import ArenaOutputExecutor
from vfuse.runtime.pool import donated_views
from vfuse.schedule.donate import _spans


class _Mlp(nn.Module):
    """LN -> Linear -> GELU -> Linear -> SwiGLU-ish gate: weight gradients born after activations die."""

    def __init__(self, d: int = 37, h: int = 101) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.a, self.b = nn.Linear(d, h), nn.Linear(h, d)
        self.gate, self.up, self.down = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.b(F.gelu(self.a(self.norm(x))))
        return y + self.down(F.silu(self.gate(y)) * self.up(y))


def _backward_programs(backend) -> list:
    return [g.executor.program for g in backend.compiled if getattr(g.executor, "program", None) is not None]


def _donating(backend) -> list:
    return [p for p in _backward_programs(backend) if p.donated]


def _train(set_to_none: bool, accumulate: int, steps: int = 4) -> None:
    torch.manual_seed(0)
    eager = _Mlp()
    model = copy.deepcopy(eager)
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_m = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt_e.zero_grad(set_to_none=set_to_none)
        opt_m.zero_grad(set_to_none=set_to_none)
        outs = []
        for k in range(accumulate):
            x = torch.randn(53, 37, generator=torch.Generator().manual_seed(step * 7 + k))
            out = fwd(x)
            outs.append((out.detach().clone(), out))  # the user's output must not be written over
            out.square().mean().backward()
            eager(x).square().mean().backward()
        for before, out in outs:
            torch.testing.assert_close(out.detach(), before, rtol=0, atol=0)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            scale = q.grad.abs().max().clamp_min(1e-6)
            err = ((p.grad - q.grad).abs().max() / scale).item()
            assert err < 1e-4, (step, name, err)
        opt_e.step()
        opt_m.step()
    assert _donating(backend), "the backward stored no gradient into a donated activation"


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_gradients_match_eager_across_steps(set_to_none: bool, accumulate: int) -> None:
    torch._dynamo.reset()
    _train(set_to_none, accumulate)


def test_gradients_live_in_forward_buffers_and_the_arena() -> None:
    """With zero_grad(set_to_none=True) the donated gradients are views of the forward's pooled
    saved activations, the same storages each step (nothing allocated for them); the others live
    in the backward's arena (runtime/arena_outputs.py), one storage per call that the executor
    does not keep."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Mlp()
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    x = torch.randn(53, 37)
    seen = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        fwd(x).square().mean().backward()
        seen.append([p.grad.untyped_storage().data_ptr() for p in model.parameters()])
    forward, backward = (g.executor for g in backend.compiled)
    assert isinstance(backward, ArenaOutputExecutor) and backward._arena is None
    pooled = {ring[0][0].untyped_storage().data_ptr() for ring in forward._pool._slots.values()}
    donated = [i for i, ptr in enumerate(seen[2]) if ptr in pooled]
    rest = {ptr for i, ptr in enumerate(seen[2]) if i not in donated}
    assert donated and len(rest) == 1, (donated, rest)
    assert [seen[1][i] for i in donated] == [seen[2][i] for i in donated]
    assert len(donated) <= len(backward.program.donated)
    assert len(seen[2]) - len(donated) <= len(backward.program.arena_outputs)


def test_no_donor_is_read_after_an_output_is_stored_into_it() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Mlp()
    backend = vfuse.backend(strict=True)
    torch.compile(model, backend=backend)(torch.randn(53, 37)).sum().backward()
    (prog,) = _donating(backend)
    graph = next(g.graph for g in backend.compiled if getattr(g.executor, "program", None) is prog)
    first, last, torch_touched = _spans(prog, graph)
    # Byte ranges in the forward's block of donors (schedule/donate.py), or per donor without one.
    block = dict(prog.donor_block)
    assert len(block) > 1 and prog.donor_block_bytes >= sum(graph[x].tensor_type.nbytes for x in block)
    ranges: list[tuple[int, int]] = []
    for v, x, offset in prog.donated:
        assert x not in torch_touched and v not in torch_touched
        start = block[x] + offset
        end = start + prog.buffers[v].type.nbytes
        assert end <= prog.donor_block_bytes
        for y, o in block.items():  # every donor whose bytes the output covers is dead by then
            if o < end and start < o + graph[y].tensor_type.nbytes:
                assert last.get(y, -1) < first[v], (v, y)
                assert y not in torch_touched
        ranges.append((start, end))
    ranges.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))


def test_retain_graph_is_never_corrupted() -> None:
    """A backward that keeps the graph reads the saved activations twice: AOTAutograd compiles
    it without donations when the first backward keeps the graph, and refuses a later one."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _Mlp()
    model = copy.deepcopy(eager)
    fwd = torch.compile(model, backend=vfuse.backend(strict=True))
    x = torch.randn(53, 37)
    loss = fwd(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    eager(x).square().mean().mul(2).backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    model.zero_grad(set_to_none=True)
    loss = fwd(x).square().mean()
    loss.backward()  # compiled already, without donations: keeping the graph is fine too
    loss2 = fwd(x).square().mean()
    loss2.backward(retain_graph=True)
    loss2.backward()


def test_one_value_at_two_outputs_is_not_donated() -> None:
    """vfuse's CSE returns `x.sin()` and `x.sin()` as one tensor at two outputs; torch's trace saw
    two tensors and may list either as a donated saved tensor: the forward's check drops both,
    keeps the kernel-written output returned once."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    with torch.no_grad():
        torch.compile(lambda x: (x.sin(), torch.sin(x) + 0, x.cos()), backend=backend)(torch.randn(67))
    (compiled,) = backend.compiled
    outs = compiled.graph.outputs
    assert outs[0] == outs[1] != outs[2], outs  # what this test is about: one value twice
    slots = (COMPUTED, COMPUTED, COMPUTED, None)  # a constant output: no buffer
    meta = SimpleNamespace(bw_donated_idxs=[0, 1, 2, 3], tensors_saved_for_backwards_slice=slice(0, None))
    meta.num_symints_saved_for_bw = 0
    listed = meta.bw_donated_idxs
    context = torch._guards.TracingContext(None)
    context.fw_metadata = meta
    with torch._guards.tracing(context):
        check_donated(compiled, slots, lifted=False)
        assert donated_inputs() == (2,)
    assert listed == [2]  # the list AOTAutograd's retain_graph check reads, edited in place


def test_relu_and_clamp_outputs_train_as_eager() -> None:
    """relu and clamp(min=0) may be one value after vfuse's CSE: the user's output is never written over."""

    class TwoOutputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(29, 31)
            self.w = nn.Parameter(torch.randn(31))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = self.lin(x)
            return z.relu(), (z.clamp(min=0) * self.w).tanh()

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TwoOutputs()
    model = copy.deepcopy(eager)
    fwd = torch.compile(model, backend=vfuse.backend(strict=True))
    x = torch.randn(47, 29)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        a, b = fwd(x)
        keep = a.detach().clone()
        (a.sum() + b.square().sum()).backward()
        torch.testing.assert_close(a.detach(), keep, rtol=0, atol=0)
        ea, eb = eager(x)
        (ea.sum() + eb.square().sum()).backward()
        torch.testing.assert_close(a, ea, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_donor_sharing_storage_with_another_input_is_refused() -> None:
    base = torch.zeros(64)
    donor, other = base[:32], base[32:]
    fresh = torch.zeros(32)
    wanted = [("g", (8,), torch.float32)]
    env = {"x": donor}
    assert donated_views([("g", "x", 0)], wanted, env, [donor, other]) == {}
    env = {"x": fresh}
    views = donated_views([("g", "x", 64), ("h", "x", 0)], [*wanted, ("h", (4,), torch.float32)], env, [fresh])
    view = views["g"]
    assert views["h"].data_ptr() == fresh.data_ptr() and views["h"].shape == (4,)
    assert view.untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr()
    assert view.data_ptr() == fresh.data_ptr() + 64 and view.shape == (8,)
    # a donor too small for the planned bytes (a smaller tensor at run time) is refused
    assert donated_views([("g", "x", 120)], wanted, {"x": fresh}, [fresh]) == {}


def test_outputs_sharing_memory_by_design_are_not_copied() -> None:
    """A graph whose outputs may alias (an input returned) copies outputs sharing memory with an
    input or an earlier one, but not those placed in a donated input or the arena (their own
    bytes); a placed output returned again later is still copied."""
    from vfuse.runtime.compiled import _unalias

    arena = torch.zeros(16)
    a, b = arena[:8], arena[8:]
    donor = torch.zeros(4)
    g = donor[:2]
    x = torch.ones(3)
    outs = _unalias([a, b, g, x, a], [donor, x], placed={0, 1, 2})
    assert outs[0] is a and outs[1] is b and outs[2] is g
    assert outs[3] is not x and outs[4] is not a
    torch.testing.assert_close(outs[4], a)
    assert outs[4].untyped_storage().data_ptr() != arena.untyped_storage().data_ptr()
    # without `placed`, everything sharing memory is copied (the earlier behaviour)
    outs = _unalias([a, b], [], placed=())
    assert outs[0] is a and outs[1] is not b
