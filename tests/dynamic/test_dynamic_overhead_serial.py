"""A kernel whose threads are chosen per call (`Kernel.thread_gate`) has a serial copy of each
parallel loop for calls on one thread (codegen/cpp/streaming.py `serial_copy`): entering an
OpenMP region of one thread costs libgomp ~0.4 us, and tiny_graph's row kernel entered 11 per
call (5.5 us where the static kernel takes 0.7). Both copies compute the same: checked on
either side of the gate, on one and two threads."""

from __future__ import annotations

import pytest
import torch
from tests.dynamic.row_chain import RowChain, check_lengths

import vfuse
from vfuse.schedule.kernel import Kernel, Program
from vfuse.schedule.strategy import PARALLEL_MIN


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_loops_have_a_serial_copy(rendered: list[tuple[Program, str]], threads: int) -> None:
    c = torch.compile(RowChain(), backend=vfuse.backend(strict=True), dynamic=True)
    check_lengths(c, (49, 64, 2, 97, PARALLEL_MIN + 13, 7, 3 * PARALLEL_MIN + 1), threads, atol=1e-4)
    ((program, source),) = rendered  # one build serves every size
    (k,) = [k for k in program.kernels if isinstance(k, Kernel)]
    assert k.thread_gate is not None and k.threaded
    lines = [line.strip() for line in source.splitlines()]
    regions = [i for i, line in enumerate(lines) if line.startswith("#pragma omp parallel")]
    assert len(regions) == 4  # 3 reduction passes and the last (streamed) one
    for i in regions:  # each inside `if (nt > 1) {`, its serial copy in the `else` after it
        assert lines[i - 1] == "if (nt > 1) {", lines[i - 2 : i + 1]
    assert sum(line == "else {" for line in lines) >= len(regions)
