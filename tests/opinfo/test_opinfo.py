"""PyTorch's OpInfo samples of every op vfuse lowers, through torch.compile(backend="vfuse").

`make test`: the first SUBSET_SAMPLES samples of each op, float32, compiled a chunk of ops at a
time. `make fuzz` (VFUSE_FUZZ=soak): every sample, float32 and one low-precision dtype. A sample
passes when it matches eager within the OpInfo's tolerances, or when vfuse ran its graph eagerly
with a warning (visible, counted apart in the summary); a mismatch or an exception fails.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from tests.opinfo.harness import (
    Outcome,
    Result,
    candidate_opinfos,
    low_precision_dtype,
    lowers,
    op_id,
    unlowered_targets,
)
from tests.opinfo.runner import cases_of, chunks, run_cases

FULL = os.environ.get("VFUSE_FUZZ") == "soak"
SUBSET_SAMPLES = 2
CHUNK = 24  # ops per compiled graph in the subset run


@functools.cache
def _subset(chunk: int) -> dict[str, list[Result]]:
    """Results of one chunk of ops, first samples only, float32: one compile for the chunk."""
    cases = [c for info in chunks(CHUNK)[chunk] for c in cases_of(info, torch.float32, SUBSET_SAMPLES)]
    by_op: dict[str, list[Result]] = {}
    for r in run_cases(cases, torch.float32):
        by_op.setdefault(r.op, []).append(r)
    return by_op


def _chunk_of(name: str) -> int:
    return next(i for i, ch in enumerate(chunks(CHUNK)) if name in {op_id(x) for x in ch})


def _results(info: object) -> list[Result]:
    if not FULL:
        return _subset(_chunk_of(op_id(info))).get(op_id(info), [])
    results = []
    for dtype in (torch.float32, low_precision_dtype(info)):
        if dtype is not None:
            results += run_cases(cases_of(info, dtype), dtype)
    return results


@pytest.mark.parametrize("info", candidate_opinfos(), ids=op_id)
def test_opinfo_samples_match_eager(info: object, opinfo_log: list[Result]) -> None:
    if not lowers(info):
        pytest.skip(f"vfuse does not lower {', '.join(unlowered_targets(info))}")
    results = _results(info)
    opinfo_log.extend(results)
    bad = [r for r in results if r.outcome in (Outcome.MISMATCH, Outcome.CRASH)]
    assert not bad, "\n".join(f"{r.dtype} {r.outcome.value}: {r.detail}" for r in bad)
