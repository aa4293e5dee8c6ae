"""The walks over rows: `Walk.SINGLE_ROW` (the whole nest is one row) and `Walk.ROWS` (row loops
split between threads, one row at a time, with the schedule's row prefetch)."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.codegen.cpp.moments import render_moments
from vfuse.codegen.cpp.passes import render_pass
from vfuse.codegen.cpp.prefetch import render_prefetch
from vfuse.codegen.cpp.streaming import serial_copy
from vfuse.codegen.cpp.writer import KernelWriter


def render_single_row(w: KernelWriter) -> None:
    """One row: its buffer is shared; each parallel pass loop ends with a barrier."""
    at = w.mark()
    for p in w.k.passes:
        render_pass(w, p)
    for s in w.k.after:
        w.stmt(s)
    # Row buffers are declared now that the statements' dtypes are known.
    w.insert(at, w.row_buffers(True))
    for line in w.row_buffers(False):
        w.w(line)


def render_rows(w: KernelWriter) -> None:
    row_region(w, _one_row_at_a_time)


def row_region(w: KernelWriter, walk: Callable[[KernelWriter], None]) -> None:
    """The parallel region (when the kernel is threaded) whose worksharing loop `walk` opens; with
    threads chosen per call, also its serial copy for one thread (`streaming.serial_copy`)."""
    k = w.k
    start = w.mark()
    if k.threaded:
        w.w("#pragma omp parallel num_threads(nt)")
    w.open("{")
    at = w.mark()
    if k.threaded:
        # A streaming kernel's threads fence their own stores before the region's barrier.
        nowait = " nowait" if k.stream else ""
        collapse = f" collapse({len(k.outer)})" if len(k.outer) > 1 else ""
        w.w(f"#pragma omp for schedule(static){nowait}{collapse}")
    walk(w)
    if k.stream:
        w.w("vf_stream_fence();")
    w.insert(at, w.row_buffers(True))
    for line in w.row_buffers(False):
        w.w(line)
    w.close()
    if k.threaded:
        serial_copy(w, start)


def _one_row_at_a_time(w: KernelWriter) -> None:
    k = w.k
    for lp in k.outer:
        w.open_loop(lp)
    for i, p in enumerate(k.passes):
        if k.moments and i == 1:
            continue  # rendered with pass 0
        if k.prefetch:
            render_prefetch(w, k.prefetch, i)
        if k.moments and i == 0:
            render_moments(w, p, k.passes[1], lambda: _prefetch(w, 1))
        else:
            render_pass(w, p)
    for s in k.after:
        w.stmt(s)
    w.close(len(k.outer))


def _prefetch(w: KernelWriter, i: int) -> None:
    if w.k.prefetch:
        render_prefetch(w, w.k.prefetch, i)
