"""Short rows of a symbolic length carry a copy scheduled at the length's hint
(schedule/rowhint.py, `Kernel.at_hint`): the copy accumulates over a constant length (lanes or
strips, as a static build), the generic kernel over any (lanes with a masked last vector); each
call runs the one its sizes select (codegen/cpp/render.hint_copy). Checked against eager at the
hint and other sizes, on one and two threads; at the hint the dynamic build's output is bit for
bit the static build's."""

from __future__ import annotations

import pytest
import torch
from tests.dynamic.row_chain import RowChain, check_lengths, inputs

import vfuse
from vfuse.schedule.choices import per_call_choices
from vfuse.schedule.kernel import Accumulate, Kernel, Program
from vfuse.schedule.strategy import PARALLEL_MIN


def _kernel(rendered: list[tuple[Program, str]]) -> tuple[Kernel, str]:
    ((program, source),) = rendered  # one build serves every size
    (k,) = [k for k in program.kernels if isinstance(k, Kernel)]
    return k, source


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hint", [64, 49])
def test_short_rows_have_a_copy_at_the_hint(rendered: list[tuple[Program, str]], hint: int, threads: int) -> None:
    c = torch.compile(RowChain(), backend=vfuse.backend(strict=True), dynamic=True)
    lengths = (hint, 64, 49, 7, 2, 97, 256, PARALLEL_MIN + 13, 3 * PARALLEL_MIN + 1, hint)
    check_lengths(c, lengths, threads, atol=1e-5)
    k, source = _kernel(rendered)
    assert k.at_hint is not None and k.thread_gate is not None
    ((symbol, value),) = k.at_hint.sizes
    assert value == hint
    copy = k.at_hint.kernel
    assert copy.inner[0].size == hint and not copy.threaded
    # AVX2: lanes at 64; at 49 strips (but the first pass: tanh of loads not prefetched keeps the plain sum).
    assert {p.reduction.kind for p in copy.passes if p.reduces} & {Accumulate.LANES, Accumulate.STRIPS}
    # The generic kernel: lanes over the run-time length, whole vectors then a masked one (test_dynamic_short_rows.py).
    assert all(p.reduction.kind is Accumulate.LANES and p.reduction.vector for p in k.passes if p.reduces)
    assert f"static void {k.name}_hint(" in source and f"static void {k.name}_any(" in source
    assert f"if (vf_{symbol} == {hint}) {k.name}_hint(" in source
    line = f"{k.name} ({k.label}) row length: chosen per call, a copy where {symbol} = {hint}"
    assert any(s.startswith(line) for s in per_call_choices(_program(rendered))), per_call_choices(_program(rendered))


def _program(rendered: list[tuple[Program, str]]) -> Program:
    return rendered[0][0]


def test_the_copy_computes_as_the_static_build(rendered: list[tuple[Program, str]]) -> None:
    """At the hint the copy sums as the static kernel does (32 lanes folded pairwise): the same
    bits; the generic kernel's run-time lanes need not be."""
    m = RowChain()
    dyn = torch.compile(m, backend=vfuse.backend(strict=True), dynamic=True)
    static = torch.compile(RowChain(), backend=vfuse.backend(strict=True), dynamic=False)
    with torch.no_grad():
        x, y = inputs(64)
        dyn(x, y)  # the hint: 64
        for n in (9, 64):
            a, b = inputs(n)
            torch.testing.assert_close(dyn(a, b), m(a, b), rtol=1e-5, atol=1e-5)
        assert torch.equal(dyn(x, y), static(x, y))


@pytest.mark.parametrize("n", [4096, 2])
def test_no_copy_for_long_rows_or_the_same_walk(rendered: list[tuple[Program, str]], n: int) -> None:
    """4096: not a short row. 2: at that length the copy would take the plain SIMD loop, no faster
    than the generic kernel's run-time lanes."""
    m = RowChain()
    c = torch.compile(m, backend=vfuse.backend(strict=True), dynamic=True)
    with torch.no_grad():
        for size in (n, 2 * n + 3):
            x, y = inputs(size)
            torch.testing.assert_close(c(x, y), m(x, y), rtol=1e-5, atol=1e-5)
    k, source = _kernel(rendered)
    assert k.at_hint is None and "_hint(" not in source


def test_fixed_sizes_have_no_copy(rendered: list[tuple[Program, str]]) -> None:
    m = RowChain()
    c = torch.compile(m, backend=vfuse.backend(strict=True), dynamic=False)
    with torch.no_grad():
        x, y = inputs(64)
        torch.testing.assert_close(c(x, y), m(x, y), rtol=1e-5, atol=1e-5)
    k, _ = _kernel(rendered)
    assert k.at_hint is None
