"""The per-call path after the guard: the pool writes output pointers into the pointer table
itself, a plan whose outputs are in order returns the pool's list, Dynamo gets the executor with
no frame of ours in between, and none of it changes what a call returns."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

import vfuse
from vfuse.runtime.pool import OutputPool


def test_the_pool_binds_every_output_pointer_it_hands_out() -> None:
    pool = OutputPool()
    ptrs = (ctypes.c_void_p * 4)()
    wanted = [("a", (3, 5), torch.float32), ("b", (7,), torch.int8)]
    held = []
    for _ in range(4):  # both slots of each ring, then reuse
        outs = pool.take(wanted, False, ptrs, (2, 0))
        assert [ptrs[2], ptrs[0]] == [t.data_ptr() for t in outs]
        held.append(outs)
        if len(held) > 1:
            held.pop(0)
    small = pool.take([("a", (2, 5), torch.float32)], False, ptrs, (1,))  # a view of a larger buffer
    assert ptrs[1] == small[0].data_ptr()
    outs = pool.take(wanted, False)
    outs[0].resize_(1000)  # the caller grew it: a new buffer, bound at its own address
    del outs
    again = pool.take(wanted, False, ptrs, (2, 0))
    assert ptrs[2] == again[0].data_ptr() and again[0].shape == (3, 5)


def _outputs_in_order(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sigmoid(x) * 3, x.sum(-1)


def _outputs_reordered(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.tanh(x) + 1
    b = x * x
    return b, a, b  # the same value twice: two tensors, no shared memory


def test_outputs_come_back_in_the_graphs_order_and_never_shared() -> None:
    x = torch.randn(5, 7)
    c = vfuse.compile(_outputs_in_order, (x,))
    plan = c.compiled.executor.call_plan
    assert plan is not None and plan.in_order
    for shape in ((5, 7),):
        y = torch.randn(shape)
        got, want = c(y), _outputs_in_order(y)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    r = vfuse.compile(_outputs_reordered, (x,))
    first = r(x)
    second = r(x)
    for got in (first, second):
        for g, w in zip(got, _outputs_reordered(x), strict=True):
            torch.testing.assert_close(g, w)
        assert got[0].data_ptr() != got[2].data_ptr()
    assert {t.data_ptr() for t in first}.isdisjoint(t.data_ptr() for t in second)


def test_dynamo_calls_the_executor_directly_and_the_graph_stays_registered() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    handed: list[Any] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = backend(gm, example_inputs)
        handed.append(fn)
        return fn

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x - y) * 0.5

    g = torch.compile(f, backend=recording)
    x, y = torch.randn(4, 9), torch.randn(4, 9)
    with torch.no_grad():
        torch.testing.assert_close(g(x, y), f(x, y))
        outs = [g(x, y) for _ in range(3)]  # held: each call a fresh buffer
    assert len({o.data_ptr() for o in outs}) == 3
    (fn,) = handed
    compiled = backend.compiled[0]
    assert fn.boxed.run_list is compiled.executor
    assert fn.boxed.compiled is compiled and compiled in vfuse.compiled_graphs()
    torch.testing.assert_close(fn(x, y)[0], f(x, y))


def test_grad_mode_calls_still_run_through_autograd() -> None:
    """The direct entry (plain tensors, nothing lifted) still asks whether a call needs
    gradients: an input that requires grad gets a differentiable output."""
    x = torch.randn(6)
    c = vfuse.compile(lambda t: torch.sin(t) * 2, (x,))
    w = torch.randn(6, requires_grad=True)
    out = c(w)
    assert out.requires_grad
    out.sum().backward()
    assert w.grad is not None
    torch.testing.assert_close(w.grad, 2 * torch.cos(w.detach()))
    with torch.no_grad():
        assert not c(w).requires_grad


def test_grad_mode_inference_graphs_skip_the_wrappers_and_stay_inference() -> None:
    """Grad mode on, no input requiring grad: AOTAutograd compiles for inference and Dynamo
    guards on requires_grad, so the executor is handed over directly; a torch step (cumsum,
    a fallback) records no history; an input that requires grad gets a training graph."""
    torch._dynamo.reset()
    backend = vfuse.backend()
    handed: list[Any] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = backend(gm, example_inputs)
        handed.append(fn)
        return fn

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(x), dim=1) * 2 + x

    g = torch.compile(f, backend=recording)
    x = torch.randn(3, 5)
    assert torch.is_grad_enabled()
    out = g(x)
    torch.testing.assert_close(out, f(x))
    assert not out.requires_grad and out.grad_fn is None
    assert hasattr(handed[0], "boxed")  # entry/direct.unboxed: no AOTAutograd wrappers
    w = x.clone().requires_grad_()
    y = g(w)
    assert y.requires_grad and len(handed) == 2
    y.sum().backward()
    w2 = x.clone().requires_grad_()
    f(w2).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
