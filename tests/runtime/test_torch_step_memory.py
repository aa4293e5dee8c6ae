"""Torch steps between kernels (runtime/steps.py): a view of the arena is copied only when a later
step or the caller reads it, and the general path drops each torch-step value after its last use.
Checked by gradients against eager and by the backward call's allocations (torch's profiler)."""

from __future__ import annotations

import torch
from torch import nn

import vfuse
from vfuse.bench.train import step_peak_bytes
from vfuse.ir import Op
from vfuse.runtime.steps import drops_after_steps
from vfuse.schedule import TorchStep


def test_conv_weight_gradient_reads_the_arena_without_a_copy() -> None:
    """Conv -> train BN -> ReLU (odd sizes): the backward's BN gradient is a kernel's arena value
    that the bias gradient's sum and the torch weight-gradient conv (through a reshape) read; no copy of it is made (the
    reshape-then-permute copies the conv needs stay), gradients equal eager's. Two groups: a
    one-group weight gradient is the folded template (codegen/cpp/gemm/conv_wgrad.py), no torch step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 12, 3, padding=1, groups=2), nn.BatchNorm2d(12), nn.ReLU()).train()
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = torch.randn(3, 8, 23, 29)
    backend = vfuse.backend(strict=True)
    fwd = torch.compile(model, backend=backend)
    out = fwd(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [p.grad.clone() for p in model.parameters()]
    y = torch.nn.functional.conv2d(x, ref[0], ref[1], padding=1, groups=2)
    y = torch.nn.functional.batch_norm(y, None, None, ref[2], ref[3], training=True)
    want = torch.autograd.grad(torch.relu(y), ref, grad)
    scale = max(b.abs().max().item() for b in want)  # the conv bias's is 0 up to rounding (BN follows)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale)
    bwd = backend.compiled[-1]
    steps = [s for s in bwd.executor.program.steps if isinstance(s, TorchStep)]
    assert any(bwd.executor.graph[n].op is Op.CONV2D for s in steps for n in s.nodes), "no torch conv step"

    for p in model.parameters():
        p.grad = None
    out = fwd(x)
    act = out.numel() * 4  # one activation: (3, 12, 23, 29) fp32
    # Allocated by the backward and live at once (4.14 activations): the arena (the BN gradient),
    # x and the gradient permuted for the conv, the conv's own buffers; the copy of the arena
    # view made before was one activation more (5.14).
    assert step_peak_bytes(lambda: out.backward(grad)) <= 4.6 * act


def test_values_are_dropped_after_their_last_step() -> None:
    """drops_after_steps: every value a step reads is dropped after the last step reading it,
    never a graph output, and each value at most once."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Conv2d(5, 6, 3, stride=2), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 3)).train()
    backend = vfuse.backend(strict=True)
    torch.compile(model, backend=backend)(torch.randn(2, 5, 13, 11)).sum().backward()
    for g in backend.compiled:
        ex = g.executor
        drops = drops_after_steps(ex.program, ex.graph, ex._slots)
        flat = [v for d in drops for v in d]
        assert len(flat) == len(set(flat))
        assert not any(ex.graph.is_output(v) for v in flat)
        for i in range(len(ex.program.steps)):
            later = ex.program.steps[i + 1 :]
            read_later = {v for s in later if isinstance(s, TorchStep) for n in s.nodes for v in ex.graph[n].inputs}
            read_later |= {v for s in later if not isinstance(s, TorchStep) for v, _ in ex._slots[s.name]}
            assert not set(drops[i]) & read_later, (g, i)
