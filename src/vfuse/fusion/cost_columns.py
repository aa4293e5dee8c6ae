"""Column walks past the cache: the memory time of a reduction over a non-innermost axis.

Such a kernel walks its input in column tiles (`schedule/strategy.column_tile`: 4 vectors of adjacent
columns as the SIMD loop, the reduced rows outside), so every row contributes one short run (128 B at
AVX2) per tile, one row stride apart, and the input is walked once per tile. From the cache that is
bandwidth-bound like any read. Past the last-level cache each run is a demand miss: the hardware
prefetchers follow neither a 4 KB stride (a new page per row) nor short runs re-walked per tile, so
the misses in flight are what the out-of-order window reaches, not the streams' 20-odd. Zen 3, one
thread: 16384 x 1024 summed over rows (a 4 KB stride, 32 tiles) and 95433 x 100 (400 B, 4 tiles)
both took 25-26 ns per run, ~4-5 GB/s against the 15.7 GB/s of a streaming read (predicted 3-4x
too fast before; docs/cost_model.md).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from vfuse.fusion.forms import numel_of
from vfuse.ir import Graph, Kind, Node
from vfuse.ir.sym import hint
from vfuse.targets import Target

COLUMN_VECTORS = 4  # schedule/strategy.COLUMN_VECTORS: a column tile is 4 vectors of adjacent columns
# One run's demand miss past the LLC, on one core: DRAM latency over the misses its window keeps in
# flight (~100 ns / 4). Zen 3 measured 25-26 ns at a 4 KB and at a 400 B row stride; a calibrated
# target has its own (`Target.strided_run_s`: Zen 4 10-11 ns at AVX2 and AVX-512).
STRIDED_RUN_S = 25e-9


def column_runs(nodes: Sequence[Node], inputs: Collection[str], graph: Graph, target: Target) -> int:
    """Strided row runs of a CPU kernel's column walks: for each reduction whose innermost reduced axis
    has more than one column tile inside it, every external input read at the reduction's full space
    takes (rows x tiles) runs (once per input, however many reductions read it). 0 for other kernels
    and on uncalibrated targets, whose model has no memory hierarchy (`cost.memory_bw`)."""
    if target.is_gpu or target.l2_bw <= 0:
        return 0
    tile = COLUMN_VECTORS * target.simd_lanes
    runs: dict[str, int] = {}
    for n in nodes:
        axes = n.attrs.get("axes") if n.kind is Kind.REDUCE else None
        if not axes:
            continue
        shape = tuple(hint(d) for d in graph[n.inputs[0]].tensor_type.shape)
        inner, full = math.prod(shape[max(axes) + 1 :]), math.prod(shape)
        if inner <= tile or full == 0:
            continue  # a row reduction, or one tile wide: a contiguous walk
        walk = full // inner * math.ceil(inner / tile)
        for i in inputs:
            if hint(numel_of(graph[i])) == full:
                runs[i] = max(runs.get(i, 0), walk)
    return sum(runs.values())


def missed_share(target: Target, nbytes: int) -> float:
    """The share of a walk over `nbytes` that misses the LLC: none up to a quarter of L3 (where
    `cost.memory_bw` still reads at L3 bandwidth), all from the L3 size on, log-interpolated between
    (no step for a merge to cross)."""
    lo, hi = target.l3_bytes / 4, float(target.l3_bytes)
    if hi <= 0 or nbytes <= lo:
        return 0.0
    if nbytes >= hi:
        return 1.0
    return math.log(nbytes / lo) / math.log(hi / lo)


def strided_s(runs: int, nbytes: int, target: Target) -> float:
    """Memory time of `runs` strided runs in a kernel moving `nbytes`: each run past the LLC a demand
    miss (`Target.strided_run_s`, else STRIDED_RUN_S), on all threads (every core keeps its own misses
    in flight)."""
    if runs <= 0:
        return 0.0
    run_s = target.strided_run_s or STRIDED_RUN_S
    return runs * missed_share(target, nbytes) * run_s / max(target.max_threads, 1)
