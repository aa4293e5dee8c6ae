"""Threads over symbolic sizes (schedule/strategy.py `thread_choice`): where the sizes' range holds
calls on both sides of PARALLEL_MIN loop points, the kernel is rendered threaded and each call
drops to one thread below the gate (`Kernel.thread_gate`, codegen/cpp/function.py), instead of a
choice taken at the first call's size: a first call of 5 rows left every later call on one thread."""

from __future__ import annotations

import math

import pytest
import torch

import vfuse
from vfuse.schedule.kernel import Kernel, Program
from vfuse.schedule.strategy import PARALLEL_MIN


@pytest.fixture
def built(rendered: list[tuple[Program, str]]) -> list[tuple[Program, str]]:
    return rendered


def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2, -1) + torch.nn.functional.layer_norm(x, x.shape[-1:], w)


@pytest.mark.parametrize("first", [(5, 96), (1000, 96)])
def test_threads_chosen_per_call_from_either_side(built: list, first: tuple[int, int]) -> None:
    shapes = [first, (3, 96), (400, 96), (2, 96), (701, 96), (97, 96)]
    w = torch.rand(96) + 0.5
    c = torch.compile(_f, backend=vfuse.backend(strict=True), dynamic=True)
    with torch.no_grad():
        for i, shape in enumerate(shapes):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(i))
            torch.testing.assert_close(c(x, w), _f(x, w), rtol=1e-5, atol=1e-5)
    ((program, source),) = built  # one build serves every size
    gated = [k for k in program.kernels if isinstance(k, Kernel) and k.thread_gate is not None]
    assert gated and all(k.threaded and k.thread_gate.limit == PARALLEL_MIN for k in gated)
    points = [math.prod(s) for s in shapes]
    assert min(points) < PARALLEL_MIN <= max(points)  # both sides ran
    # A kernel's copy at its row length's hint (schedule/rowhint.py) tests the gate too where it keeps one.
    copies = [k.at_hint.kernel for k in gated if k.at_hint is not None and k.at_hint.kernel.thread_gate is not None]
    assert source.count(f") < (int64_t){PARALLEL_MIN}LL) nt = 1;") == len(gated) + len(copies)


@pytest.mark.parametrize(("shape", "threaded"), [((5, 96), False), ((1000, 96), True)])
def test_fixed_sizes_decide_once_without_a_gate(built: list, shape: tuple[int, int], threaded: bool) -> None:
    w = torch.rand(96) + 0.5
    c = torch.compile(_f, backend=vfuse.backend(strict=True), dynamic=False)
    x = torch.randn(*shape)
    with torch.no_grad():
        torch.testing.assert_close(c(x, w), _f(x, w), rtol=1e-5, atol=1e-5)
    ((program, source),) = built
    kernels = [k for k in program.kernels if isinstance(k, Kernel)]
    assert kernels and all(k.thread_gate is None and k.threaded is threaded for k in kernels)
    assert "nt = 1;" not in source
