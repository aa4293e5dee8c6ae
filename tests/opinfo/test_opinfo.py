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
# Ops per compiled graph in the subset run. 24 is the cheapest measured: this file's CPU time with
# a cold kernel cache was 72 s at 12, 62 s at 24, 71 s at 48 (larger graphs cost more than their
# share; session 19, docs/perf-log.md).
CHUNK = 24


# Samples that cannot share their chunk's graph (Dynamo cannot trace them whole, or vfuse runs
# their graph eagerly): compiled one by one from the start. In the chunk they failed its compile,
# which was then halved until they stood alone, compiling the chunk's other samples 5-10 times over
# (session 18: 13-21 compiles for such a chunk instead of 1). Outcomes are the same either way; an
# op missing here only costs that bisection, one listed needlessly only its own compiles.
ALONE = frozenset({
    "uniform", "rand_like", "randint", "empty_strided", "bernoulli", "nn.functional.dropout",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train", "nn.functional.scaled_dot_product_attention",
    "sparse.mm.reduce",  # Dynamo: a function marked as skipped, or a sparse tensor
    "narrow", "chalf",  # one of their samples' graphs runs eagerly
})  # fmt: skip


@functools.cache
def _subset(chunk: int) -> dict[str, list[Result]]:
    """Results of one chunk of ops, first samples only, float32: one compile for the chunk (and
    one for each sample of an op in ALONE)."""
    cases = [c for info in chunks(CHUNK)[chunk] for c in cases_of(info, torch.float32, SUBSET_SAMPLES)]
    together = [c for c in cases if op_id(c.info) not in ALONE]
    results = run_cases(together, torch.float32)
    for case in (c for c in cases if op_id(c.info) in ALONE):
        results += run_cases([case], torch.float32)
    by_op: dict[str, list[Result]] = {}
    for r in results:
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
