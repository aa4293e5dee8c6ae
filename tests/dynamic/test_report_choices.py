"""The report over symbolic sizes (`vfuse.explain(..., dynamic_shapes=...)`): the choices still
taken at the hint that change within the range are named with the size where they change (row
groups vs rows), and choices made per call say so with their test (transposed tiles' streamed
stores, with the rows' line alignment; GEMM cache blocks, with the row counts of each).
No g++: the report schedules and names, it does not build. The target is fixed."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.export import Dim

import vfuse
import vfuse.compiler as compiler
from vfuse.report.model import FusionReport
from vfuse.targets import get_target
from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa


@pytest.fixture(autouse=True)
def _target(monkeypatch: pytest.MonkeyPatch) -> None:
    target = dataclasses.replace(get_target("cpu"), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20)
    monkeypatch.setattr(compiler, "target_of", lambda ctx: target)


def _names(report: FusionReport) -> list[str]:
    return [s.split(" = ")[0] for s in report.symbols]


def test_row_groups_from_eight_rows_are_named_with_the_size() -> None:
    # Rows of 256 go in groups of 4 from 8 rows on (strategy.use_row_groups): the walk is taken at
    # the hint, and the report says where it changes.
    ln = torch.nn.LayerNorm(256)
    rows = Dim("rows", min=2, max=1 << 20)
    report = vfuse.explain(ln, torch.randn(4, 256), dynamic_shapes={"input": {0: rows}})
    (n,) = _names(report)
    assert f"k0 (row) walk: rows at {n}=4; row groups of 4 from {n}=8" in report.flips, report.flips
    at_many = vfuse.explain(ln, torch.randn(600, 256), dynamic_shapes={"input": {0: rows}})
    (n,) = _names(at_many)
    assert f"k0 (row) walk: row groups of 4 at {n}=600; rows up to {n}=7" in at_many.flips, at_many.flips


def test_gemm_cache_blocks_are_chosen_per_call_and_named() -> None:
    lin = torch.nn.Linear(1024, 1024)
    rows = Dim("rows", min=2, max=1 << 20)
    report = vfuse.explain(lin, torch.randn(64, 1024), dynamic_shapes={"input": {0: rows}})
    (n,) = _names(report)
    (line,) = [f for f in report.flips if " GEMM blocks: " in f]
    # 64 rows are one M block; from some row count on the blocks change (schedule/blocks.py): the
    # driver picks them per call. At the avx2 and avx512 tiers M is cut into blocks the L2 holds,
    # at the generic tier (4-wide vectors) the N block changes first.
    how = line.split(" GEMM blocks: chosen per call, ")[1]
    first, *rest = how.split("; ")
    assert first.startswith("M in one block") and f" up to {n} = " in first and rest[-1].endswith(" above"), line
    if isa_for(None).tier is not Isa.GENERIC:
        assert rest[-1].startswith("M in blocks of "), line


def test_transposed_tiles_stream_per_call_by_bytes_and_alignment() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.t() + y

    a, b = Dim("a", min=2, max=1 << 16), Dim("b", min=2, max=1 << 16)
    x, y = torch.randn(2048, 1024), torch.randn(1024, 2048)
    report = vfuse.explain(f, x, y, dynamic_shapes={"x": {0: b, 1: a}, "y": {0: a, 1: b}})
    # The output's rows are b floats: each starts on a cache line where 4*b is a multiple of 64.
    lines = [f for f in report.flips if "stores: chosen per call, streamed where " in f]
    assert len(lines) == 1 and lines[0].endswith(" % 64 == 0"), report.flips
    assert f">= {2 * (32 << 20)} bytes and " in lines[0]
