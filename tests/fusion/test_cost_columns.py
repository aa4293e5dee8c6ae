"""Column walks past the cache (`fusion/cost_columns.py`): a reduction over a non-innermost axis reads
one short run per row and column tile, and past the LLC each run is a demand miss the prefetchers do
not cover; on calibrated targets the kernel's memory time is at least those misses."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from tests.fusion.fusion_patterns import FIXED_CPU, _input

from vfuse.fusion import estimate
from vfuse.fusion.cost import memory_bw
from vfuse.fusion.cost_columns import COLUMN_VECTORS, STRIDED_RUN_S, missed_share
from vfuse.ir import Graph, GraphBuilder, Op, verify

# One AVX2 thread of FIXED_CPU with a memory hierarchy, as `vfuse calibrate` and `targets.calibrate.at_threads`
# give one (the cost check's --threads 1).
CALIBRATED = dataclasses.replace(
    FIXED_CPU, cores=1, max_threads=1, simd_lanes=8, l1_bw=70e9, l2_bw=69e9, cache_bw=46e9, dram_bw=15.7e9
)


def _sum(rows: int, cols: int, axis: int) -> Graph:
    b = GraphBuilder()
    x = _input(b, 0, (rows, cols))
    return verify(b.build([b.add(Op.SUM, (x,), name="s", axes=(axis,), keepdim=False)]))


def test_a_column_walk_past_the_llc_pays_a_miss_per_run() -> None:
    rows, cols = 16384, 1024  # 64 MiB, twice L3; a 4 KiB row stride
    c = estimate(["s"], _sum(rows, cols, 0), CALIBRATED)
    runs = rows * math.ceil(cols / (COLUMN_VECTORS * CALIBRATED.simd_lanes))
    assert c.memory_s == pytest.approx(runs * STRIDED_RUN_S / CALIBRATED.max_threads)
    streamed = c.bytes / memory_bw(CALIBRATED, c.bytes)
    assert c.memory_s > 2.5 * streamed  # the streaming read it was priced at before (measured: 3x)
    # The same bytes summed along rows stream: no runs.
    row = estimate(["s"], _sum(rows, cols, 1), CALIBRATED)
    assert row.memory_s == pytest.approx(row.bytes / memory_bw(CALIBRATED, row.bytes))


def test_only_past_the_cache_and_only_on_calibrated_targets() -> None:
    small = estimate(["s"], _sum(512, 512, 0), CALIBRATED)  # 1 MiB: in L3
    assert small.memory_s == pytest.approx(small.bytes / memory_bw(CALIBRATED, small.bytes))
    narrow = estimate(["s"], _sum(1 << 20, 32, 0), CALIBRATED)  # one tile wide: a contiguous walk
    assert narrow.memory_s == pytest.approx(narrow.bytes / memory_bw(CALIBRATED, narrow.bytes))
    plain = estimate(["s"], _sum(16384, 1024, 0), FIXED_CPU)  # no hierarchy: DRAM bandwidth at every size
    assert plain.memory_s == pytest.approx(plain.bytes / FIXED_CPU.dram_bw)


def test_the_missed_share_has_no_step() -> None:
    l3 = CALIBRATED.l3_bytes
    assert missed_share(CALIBRATED, l3 // 4) == 0.0 and missed_share(CALIBRATED, l3) == 1.0
    shares = [missed_share(CALIBRATED, int(l3 / 4 * 2 ** (k / 8))) for k in range(17)]
    assert all(b - a < 0.07 for a, b in itertools.pairwise(shares)) and shares == sorted(shares)
    times = [estimate(["s"], _sum(r, 1024, 0), CALIBRATED).time_s for r in range(1024, 20000, 512)]
    assert times == sorted(times)  # more rows always take longer


def test_a_calibrated_target_pays_its_own_miss_per_run() -> None:
    """`Target.strided_run_s` (`vfuse calibrate`: a column sum past L3) replaces the Zen 3 figure: a
    Zen 4 took 10-17 ns per run at one thread (the cost check's 95433 x 100 was predicted 2.2x its time)."""
    from vfuse.targets.calibrate import FIXED_COSTS, Calibration, guarded

    graph = _sum(95433, 100, 0)
    own = estimate(["s"], graph, dataclasses.replace(CALIBRATED, strided_run_s=10e-9))
    assert own.memory_s == pytest.approx(estimate(["s"], graph, CALIBRATED).memory_s * 10e-9 / STRIDED_RUN_S)
    cal = Calibration(100e9, 90e9, 80e9, 15e9, 50e9, 18e9, 100e9, 3e-8, strided_run_s=1e-6)
    assert guarded(cal, FIXED_CPU)[0].strided_run_s == 0.0 and FIXED_COSTS["strided_run_s"] < 1e-6
