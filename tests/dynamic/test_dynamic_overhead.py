"""Per-call overhead of a graph with symbolic sizes (issue 15's steady-state and new-size bars): a
small row graph (the bench's tiny_graph form: pointwise ops and row means on short rows) compiled
once by `torch.compile(dynamic=True)` matches eager at every size, 1 and primes included; a size
seen before takes the fast path (no `Dynamic._call`, one native call), runs no more of vfuse's
Python frames than the static build plus the symbolic runner's one, and a new size compiles
nothing (no Dynamo graph, no native build)."""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.dynamic.row_chain import RowChain

import vfuse
import vfuse.compiler as compiler
from vfuse.entry.dynamic import Dynamic


def _inputs(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def _counted(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(cls, name)

    def counted(self: Any, *args: Any) -> Any:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(cls, name, counted)
    return calls


def _vfuse_frames(fn: Callable[..., Any], *args: Any) -> collections.Counter[str]:
    """The Python functions of vfuse's package one call enters, by name."""
    seen: collections.Counter[str] = collections.Counter()
    root = vfuse.__file__.rsplit("/", 1)[0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("rows", [(), (3,)], ids=["one_row", "three_rows"])
def test_row_chain_matches_eager_at_every_size(rows: tuple[int, ...]) -> None:
    torch._dynamo.reset()
    m = RowChain()
    c = torch.compile(m, backend="vfuse", dynamic=True)
    for n in (49, 64, 1, 2, 7, 13, 64, 97, 1031, 3, 49):
        x, y = _inputs(*rows, n)
        torch.testing.assert_close(c(x, y), m(x, y), rtol=1e-5, atol=1e-5)


def test_steady_and_new_sizes_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._dynamo.reset()
    m = RowChain()
    static = torch.compile(RowChain(), backend="vfuse", dynamic=False)
    dyn = torch.compile(m, backend="vfuse", dynamic=True)
    a = _inputs(64)
    dyn(*_inputs(49))  # compiled here, at the hint 49 (symbolic from the start: dynamic=True)
    for _ in range(2):
        static(*a), dyn(*a)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    slow = _counted(monkeypatch, Dynamic, "_call")
    torch.testing.assert_close(dyn(*a), m(*a), rtol=1e-5, atol=1e-5)
    assert not slow, "a seen size left the fast path"

    # The steady call's vfuse frames: the static build's plus the symbolic runner's one; one
    # lean native call (its entries are bound once: `_run_planned` is the frame that calls them).
    want, got = _vfuse_frames(static, *a), _vfuse_frames(dyn, *a)
    assert got["_run_planned"] == 1 and not got["_call"], got
    extra = got - want
    assert sum(extra.values()) <= 1 and set(extra) <= {"run"}, (want, got)

    def no_build(*args: object, **kwargs: object) -> object:
        raise AssertionError("a new size compiled native code")

    monkeypatch.setattr(compiler, "build", no_build)
    for n in (97, 5, 31, 1031):  # new sizes: set up from the program, no compiler
        x, y = _inputs(n)
        torch.testing.assert_close(dyn(x, y), m(x, y), rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "a new size made Dynamo compile"
    assert len(slow) == 4  # each new size once through `_call` ...
    slow.clear()
    x, y = _inputs(31)
    torch.testing.assert_close(dyn(x, y), m(x, y), rtol=1e-5, atol=1e-5)
    assert not slow  # ... and the fast path from its second call
