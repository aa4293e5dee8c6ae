"""The steady call of a graph with symbolic sizes: a size seen before is one dict lookup keyed by
the sizes read (Dynamo's size arguments where it passes them), a new size makes its executor
without compiling, a direct call whose tensors disagree with the sizes read is refused (the
kernels would read past the shorter tensor), and a symbolic program's output pool serves its
steady size first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse
import vfuse.compiler as compiler
from vfuse.context import Context, Options
from vfuse.entry.dynamic import Dynamic
from vfuse.errors import VfuseInputError
from vfuse.frontend.symbols import sym_env


def _count_slow_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    slow: list[int] = []
    real = Dynamic._call

    def counted(self: Dynamic, args: list) -> Any:
        slow.append(1)
        return real(self, args)

    monkeypatch.setattr(Dynamic, "_call", counted)
    return slow


def _no_builds_after_first(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    builds: list[int] = []
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        assert not builds, "a new size compiled native code"
        builds.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    return builds


SIZES = ((7, 13), (64, 2), (7, 13), (2, 97), (64, 2), (7, 13), (3, 5), (2, 97))  # Dynamo specializes 0 and 1


def _run(fn: Callable, c: Callable, sizes: tuple[tuple[int, int], ...]) -> None:
    for n, m in sizes:
        x, y = torch.randn(n, m), torch.randn(n, m)
        got, want = c(x, y), fn(x, y)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            # atol: a row sum of up to 97 randn values subtracted (cancellation); summed in another
            # order than eager's it differed by 1.7e-6 once (CI, session 17).
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_seen_sizes_skip_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    slow, builds = _count_slow_calls(monkeypatch), _no_builds_after_first(monkeypatch)
    torch._dynamo.reset()

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2 + y, -1) * x.shape[0] - y.sum(-1, keepdim=True)

    backend = vfuse.backend(strict=True)
    c = torch.compile(f, backend=backend, dynamic=True)
    with torch.no_grad():
        _run(f, c, SIZES)
    assert backend.stats["graphs"] == 1 and builds == [1]
    ex = backend.compiled[0].executor
    distinct = {s for s in SIZES}
    assert ex.instantiated == len(ex.runs) == len(distinct)
    assert len(slow) == len(distinct)  # every repeated size was one lookup
    assert any(b.dim < 0 for b in ex.bindings)  # read from Dynamo's size arguments


def test_seen_sizes_with_views_and_sizes_among_the_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs that view an input keep AOTAutograd's wrappers and our per-call view: the lookup
    then finds a call with its sizes bound; the views alias each call's own input."""
    slow = _count_slow_calls(monkeypatch)
    torch._dynamo.reset()

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :1], (x + y).exp()

    backend = vfuse.backend(strict=True)
    c = torch.compile(f, backend=backend, dynamic=True)
    sizes = ((5, 3), (9, 4), (5, 3), (9, 4), (17, 2), (5, 3))
    with torch.no_grad():
        _run(f, c, sizes)
        x = torch.randn(9, 4)
        assert c(x, torch.randn(9, 4))[0].data_ptr() == x.data_ptr()
    assert backend.stats["graphs"] == 1
    assert len(slow) == len(set(sizes))


def test_direct_call_with_disagreeing_sizes_is_refused() -> None:
    """Two inputs sharing a symbol: a direct call (no Dynamo guards) with a shorter second one
    raised nothing and read past its end (a segfault at 100000 rows)."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.flatten(0).view_as(y)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(8, 6), torch.randn(8, 6))
    cg = compiler.compile_fx(gm, Context(Options(raise_codegen_errors=True)), symbols=sym_env(gm))
    for n, m in ((8, 6), (13, 1), (1, 29)):
        x, y = torch.randn(n, m), torch.randn(n, m)
        torch.testing.assert_close(cg(x, y)[0], f(x, y))
    with pytest.raises(VfuseInputError, match=r"input 1 .* size 3 at dim 0"):
        cg(torch.randn(100000, 6), torch.randn(3, 6))
    with pytest.raises(VfuseInputError, match=r"input 1 .* size 7 at dim 1"):
        cg(torch.randn(4, 5), torch.randn(4, 7))


def test_the_pool_serves_the_steady_size_first() -> None:
    """After a smaller size, the larger steady size's buffer is tried first (not the small one
    each call), and outputs still held are never handed out again."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) + 1

    c = torch.compile(f, backend=backend, dynamic=True)
    x = torch.randn(64, 8)
    with torch.no_grad():
        c(torch.randn(49, 8))
        for _ in range(3):  # outputs dropped: the 49 buffer stays in the pool, idle
            torch.testing.assert_close(c(x), f(x))
        pool = next(iter(backend.compiled[0].executor._by_size.values()))._pool  # shared by all sizes
        (ring,) = pool._slots.values()
        assert [slot[0].shape for slot in ring] == [(64, 8), (49, 8)]
        kept = [c(x) for _ in range(3)]  # held: three buffers
        assert len({t.data_ptr() for t in kept}) == 3
        for t in kept:
            torch.testing.assert_close(t, f(x))
