"""Every walk whose threads are chosen per call (`Kernel.thread_gate`) enters its OpenMP region
only when the call runs on more than one thread: row walks and row groups (`rows.row_region`),
column reductions, tiled transposes and lookup tables render `if (nt > 1) { region } else { the
same loop without pragmas }` (`streaming.serial_copy`; a one-thread region costs libgomp ~0.4 us).
Both copies are checked against eager on either side of the gate, on one and two threads."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vfuse
from vfuse.schedule.kernel import Kernel, Program, Walk
from vfuse.schedule.strategy import PARALLEL_MIN


def _rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],)) * 2


def _groups(x: torch.Tensor) -> torch.Tensor:  # RMSNorm: no row buffer (softmax's keeps row walks)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def _columns(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(0)


def _transpose(x: torch.Tensor) -> torch.Tensor:
    return x.t() * 2 + 1


def _table(x: torch.Tensor) -> torch.Tensor:
    g = torch.nn.functional.gelu((x.float() - 3) * 0.05)
    return torch.clamp(torch.round(g / 0.04) - 5, -128, 127).to(torch.int8)


def _float(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _bytes(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


_GATE_ROWS = PARALLEL_MIN // 1024  # 1024-wide rows: threaded from this many rows on
# (function, the walk it takes, input maker, shapes: the first is the hint; both sides of the gate)
CASES: dict[str, tuple[Callable, Walk, Callable, list[tuple[int, ...]]]] = {
    "rows": (_rows, Walk.ROWS, _float, [(40, 1024), (3, 1024), (_GATE_ROWS + 1, 1024), (_GATE_ROWS - 1, 1024)]),
    "groups": (_groups, Walk.ROW_GROUPS, _float, [(600, 64), (5, 64), (513, 64), (100, 64), (1031, 64)]),
    "columns": (_columns, Walk.TILED_COLUMNS, _float, [(400, 96), (5, 96), (343, 96), (100, 96), (701, 96)]),
    "transpose": (_transpose, Walk.TILED_TRANSPOSE, _float, [(96, 400), (5, 96), (96, 343), (96, 100), (96, 701)]),
    "table": (_table, Walk.LOOKUP_TABLE, _bytes, [(40000,), (100,), (PARALLEL_MIN + 1,), (5000,), (70001,)]),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_gated_regions_have_a_serial_copy(rendered: list[tuple[Program, str]], case: str, threads: int) -> None:
    fn, walk, make, shapes = CASES[case]
    # Row groups need a row length known when compiling: only their row count is symbolic.
    c = torch.compile(fn, backend=vfuse.backend(strict=True), dynamic=None if case == "groups" else True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for i, shape in enumerate(shapes):
                x = make(shape, torch.Generator().manual_seed(i))
                if case == "groups":
                    torch._dynamo.mark_dynamic(x, 0)
                got, want = c(x), fn(x)
                if want.dtype is torch.int8:  # the table's rounding of gelu: at most one step apart
                    assert (got.int() - want.int()).abs().max() <= 1
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    ((program, source),) = rendered  # one build serves every size
    (k,) = [k for k in program.kernels if isinstance(k, Kernel) and k.walk is walk]
    assert k.thread_gate is not None and k.threaded
    lines = [line.strip() for line in source.splitlines()]
    regions = [i for i, line in enumerate(lines) if line.startswith("#pragma omp parallel")]
    assert regions
    for i in regions:  # each inside `if (nt > 1) {`, its serial copy in the `else` after it
        assert lines[i - 1] == "if (nt > 1) {", lines[i - 3 : i + 1]
    assert sum(line == "else {" for line in lines) >= len(regions)
