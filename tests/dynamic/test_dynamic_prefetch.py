"""Row prefetch over symbolic sizes (schedule/prefetch.py, `RowPrefetch.gate` and a per-call
distance): where the range holds widths with and without a prefetch (rows under MIN_ROW_BYTES, or
too wide for two rows ahead in L1), or row counts on both sides of GROUP_MIN_BYTES, the kernel
computes the distance and whether to prefetch once per call (codegen/cpp/function.py), not at the
first call's size; fixed sizes keep their fixed plan and no flag. The target is fixed (32 KiB L1,
512 KiB L2: three quarters of L1 for the rows in flight) so the limits do not depend on this CPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from tests.dynamic.gates import holds, sizes_of, value

import vfuse
import vfuse.compiler as compiler
from vfuse.codegen.cpp.prefetch import PREFETCH_FLAG, PREFETCH_ROWS
from vfuse.schedule.kernel import Kernel, Program, Walk
from vfuse.targets import get_target


@pytest.fixture
def built(rendered: list[tuple[Program, str]], monkeypatch: pytest.MonkeyPatch) -> list[tuple[Program, str]]:
    target = dataclasses.replace(get_target("cpu"), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20)
    monkeypatch.setattr(compiler, "target_of", lambda ctx: target)
    return rendered


def _check(fn: Callable[[torch.Tensor], torch.Tensor], c: Callable, shapes: list[tuple[int, int]]) -> None:
    with torch.no_grad():
        for i, shape in enumerate(shapes):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(i)) * 3
            torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-5)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _prefetched(program: Program) -> Kernel:
    (k,) = [k for k in program.kernels if isinstance(k, Kernel) and k.prefetch is not None]
    return k


@pytest.mark.parametrize("first", [(9, 300), (9, 700)])
def test_softmax_prefetch_distance_and_gate_per_call(built: list, first: tuple[int, int]) -> None:
    # 300 floats a row are under MIN_ROW_BYTES (no prefetch: the first call under it left every
    # later width unprefetched); 700 take 4 rows ahead, 1000 3, and 1300 no longer fit two rows
    # ahead beside the rows in use in 24 KiB.
    shapes = [first, (5, 300), (6, 600), (7, 700), (3, 1000), (4, 1300), (2, 2100), (9, 700)]
    c = torch.compile(_softmax, backend=vfuse.backend(strict=True), dynamic=True)
    _check(_softmax, c, shapes)
    ((program, source),) = built  # one build serves every size
    k = _prefetched(program)
    pf = k.prefetch
    assert pf is not None and pf.gate is not None and k.walk is Walk.ROWS
    calls = [sizes_of(program, s) for s in shapes]
    on = [holds(pf.gate, sizes) for sizes in calls]
    assert True in on and False in on  # both paths ran
    assert len({value(pf.distance, sizes) for sizes, o in zip(calls, on, strict=True) if o}) >= 2
    assert source.count(f"const bool {PREFETCH_FLAG} =") == 1 and f"if ({PREFETCH_FLAG}) for" in source
    assert source.count(f"const int64_t {PREFETCH_ROWS} =") == 1


@pytest.mark.parametrize("first", [(300, 256), (2000, 256)])
def test_row_groups_prefetch_from_a_row_count(built: list, first: tuple[int, int]) -> None:
    # Row groups (256-wide rows): prefetched only where the input is 1 MiB or more (1024 rows).
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(256)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    c = torch.compile(ln, backend=vfuse.backend(strict=True), dynamic=True)
    shapes = [first, (9, 256), (1500, 256), (1023, 256), (1024, 256)]
    _check(ln, c, shapes)
    ((program, source),) = built
    k = _prefetched(program)
    assert k.walk is Walk.ROW_GROUPS and k.prefetch is not None and k.prefetch.gate is not None
    on = [holds(k.prefetch.gate, sizes_of(program, s)) for s in shapes]
    assert on == [first[0] >= 1024, False, True, False, True]
    assert f"if ({PREFETCH_FLAG}) for" in source and PREFETCH_ROWS not in source  # a fixed distance


@pytest.mark.parametrize("shape", [(9, 300), (9, 700), (9, 1300)])
def test_fixed_sizes_plan_once_without_a_flag(built: list, shape: tuple[int, int]) -> None:
    c = torch.compile(_softmax, backend=vfuse.backend(strict=True), dynamic=False)
    _check(_softmax, c, [shape])
    ((program, source),) = built
    kernels = [k for k in program.kernels if isinstance(k, Kernel)]
    assert all(k.prefetch is None or not k.prefetch.per_call for k in kernels)
    assert [k.prefetch is not None for k in kernels] == [shape[1] == 700]
    assert PREFETCH_FLAG not in source and PREFETCH_ROWS not in source


@pytest.mark.parametrize("dynamic", [False, True])
def test_row_kernels_with_dropout_plan_their_prefetch(built: list, dynamic: bool) -> None:
    # A RandKey has a var but no dtype: the prefetch plan's L1 budget (`_resident_bytes`) reads
    # every statement of the passes, now for short rows too (the gate's room test).
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.softmax(x, -1), 0.5, training=True)

    c = torch.compile(f, backend=vfuse.backend(strict=True), dynamic=dynamic)
    for shape in [(64, 100), (33, 700)] if dynamic else [(64, 100)]:
        x = torch.randn(*shape)
        out = c(x)
        kept = out != 0
        torch.testing.assert_close(out[kept], (torch.softmax(x, -1) * 2)[kept])
        assert 0.3 < kept.float().mean() < 0.7
