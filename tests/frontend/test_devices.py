"""Graphs that touch a device other than the CPU never reach a kernel: torch.compile runs them
eagerly with a warning naming the input or node (strict mode raises), so meta tensors give
meta results of the right shape instead of a crash."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vfuse
from vfuse.errors import VfuseCompileError


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _compiled(fn: Callable, *args: torch.Tensor, **options: object) -> tuple[torch.Tensor, object]:
    torch._dynamo.reset()
    backend = vfuse.backend(**options)
    with pytest.warns(UserWarning, match="CPU graphs only: .* is on meta"):
        out = torch.compile(fn, backend=backend)(*args)
    return out, backend


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (lambda x: torch.relu(x) * 2 + 1, (_meta(4, 5),)),  # a meta input
        (lambda s, x: x * s + 1, (torch.randn(()), _meta(3, 7))),  # a CPU scalar with a meta tensor
        (lambda x: (x * 2).to("meta") + 1, (torch.randn(4, 5),)),  # made on meta inside the graph
        (lambda x: x.sum() + torch.ones(2, 3, device="meta"), (torch.randn(4, 5),)),
    ],
)
def test_meta_graphs_run_eagerly(fn: Callable, args: tuple[torch.Tensor, ...]) -> None:
    want = fn(*args)
    got, backend = _compiled(fn, *args)
    assert got.device == want.device and got.shape == want.shape and got.dtype == want.dtype
    assert backend.stats["eager_graphs"] == 1 and backend.stats["graphs"] == 0  # type: ignore[attr-defined]


def test_meta_module_trains_eagerly() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU()).to("meta")
    out, _ = _compiled(m, _meta(4, 5))
    assert out.shape == (4, 3) and out.device.type == "meta"
    with pytest.warns(UserWarning, match="is on meta"):  # the backward graph too
        out.sum().backward()
    assert m[0].weight.grad is not None and m[0].weight.grad.shape == (3, 5)


def test_strict_raises_naming_the_input() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"CPU graphs only: input 0 .* is on meta"):
        torch.compile(lambda x: x * 2, backend=vfuse.backend(strict=True))(_meta(3))
    assert issubclass(VfuseCompileError, vfuse.VfuseError)


def test_cpu_then_meta_recompiles_instead_of_reusing_kernels() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    f = torch.compile(lambda x: torch.sigmoid(x) * 3, backend=backend)
    x = torch.randn(4, 5)
    torch.testing.assert_close(f(x), torch.sigmoid(x) * 3)
    with pytest.warns(UserWarning, match="is on meta"):
        out = f(_meta(4, 5))
    assert out.device.type == "meta" and out.shape == (4, 5)
