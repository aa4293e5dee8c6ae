"""vfuse.compile keeps eager semantics: in-place updates of inputs, parameters and buffers,
gradients through its outputs, inputs that were one tensor in the examples, a cheap call."""

from __future__ import annotations

import pytest
import torch
from torch.export import ExportedProgram

import vfuse
from vfuse.errors import VfuseCompileError, VfuseInputError


def bump(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * 2


def test_user_input_update_is_applied() -> None:
    c = vfuse.compile(bump, (torch.randn(5, 7),))
    base = torch.randn(7, 5)
    x, want = base.t(), base.t().clone()  # a non-contiguous view: the update lands in `base`
    out = bump(want)
    got = c(x)
    torch.testing.assert_close(got, out)
    torch.testing.assert_close(base.t(), want)
    assert c.autograd_backend is None  # nothing needed gradients


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(7))
        self.register_buffer("seen", torch.zeros(7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.w.mul_(0.5)
        self.seen.add_(x.sum(0))
        return torch.tanh(x * self.w + self.seen)


@pytest.mark.parametrize("grad", [False, True])
def test_parameter_and_buffer_updates_are_applied(grad: bool) -> None:
    torch.manual_seed(0)
    m, ref = Stateful(), Stateful()
    ref.load_state_dict(m.state_dict())
    c = vfuse.compile(m, (torch.randn(3, 7),))
    with torch.set_grad_enabled(grad):
        for _ in range(2):
            x = torch.randn(3, 7)
            torch.testing.assert_close(c(x), ref(x))
    torch.testing.assert_close(m.w, ref.w)
    torch.testing.assert_close(m.seen, ref.seen)
    assert (c.autograd_backend is not None) == grad  # w requires grad: the autograd path


def test_gradients_through_outputs_mixed_with_parameters() -> None:
    torch.manual_seed(0)
    lin, ref = torch.nn.Linear(7, 3), torch.nn.Linear(7, 3)
    ref.load_state_dict(lin.state_dict())
    c = vfuse.compile(lin, (torch.randn(5, 7),))
    x = torch.randn(5, 7, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    (torch.sigmoid(c(x)) * lin.weight.sum()).sum().backward()
    (torch.sigmoid(ref(xr)) * ref.weight.sum()).sum().backward()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad)
    torch.testing.assert_close(x.grad, xr.grad)
    assert c.autograd_backend.stats["graphs"] == 2  # a compiled forward and backward
    with torch.no_grad():
        out = c(x)
    assert out.grad_fn is None and not out.requires_grad


def test_one_tensor_twice_in_the_examples_is_not_baked_in() -> None:
    t = torch.randn(4, 3)
    c = vfuse.compile(lambda x, y: x * y + x, (t, t))
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    torch.testing.assert_close(c(a, b), a * b + a)
    torch.testing.assert_close(c(t, t), t * t + t)  # aliased calls stay right without updates


def test_aliased_inputs_with_an_update_are_refused() -> None:
    def update_then_read(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return y * 2

    c = vfuse.compile(update_then_read, (torch.randn(3), torch.randn(3)))
    z = torch.randn(6)
    with pytest.raises(VfuseInputError, match=r"input 0 shares memory with input 1.*in place"):
        c(z[:3], z[3:])
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(c(x.clone(), y), y * 2)


def test_meta_examples_are_refused_by_name() -> None:
    with pytest.raises(VfuseCompileError, match=r"CPU programs only: input 0 .* is on meta"):
        vfuse.compile(lambda x: x * 2, (torch.randn(3, device="meta"),))
    frozen_meta = torch.nn.Linear(4, 2).to("meta")
    with pytest.raises(VfuseCompileError, match="is on meta"):
        vfuse.compile(frozen_meta, (torch.randn(3, 4, device="meta"),), freeze=True)


def test_call_does_not_rebuild_the_call_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    c = vfuse.compile(lambda x, y: {"s": x + y, "p": [x * y]}, (torch.randn(2, 3), torch.randn(2, 3)))

    def read(self: ExportedProgram) -> None:
        raise AssertionError("call_spec read per call")

    monkeypatch.setattr(ExportedProgram, "call_spec", property(read))
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    with torch.no_grad():
        out = c(x, y)
    torch.testing.assert_close(out["s"], x + y)
    torch.testing.assert_close(out["p"][0], x * y)
    with pytest.raises(VfuseInputError, match="structure"):
        c([x], y)
