"""OpInfo outcomes as plain rows, gathered over a test session and summarized at its end.

A row holds only strings and ints: pytest-xdist workers send theirs to the controlling process
(tests/conftest.py), which prints one summary for the whole run. No torch import here: the
controller never collects tests and need not pay for it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

import pytest


class Outcome(enum.Enum):
    MATCH = "match"
    NEAR_REFERENCE = "near reference"  # low precision: as close to the float64 result as eager (runner.compare)
    MISMATCH = "mismatch"
    EAGER_GRAPH = "eager graph"  # vfuse could not compile the graph and ran it eagerly, with a warning
    CRASH = "crash"  # vfuse raised where eager did not


class Row(NamedTuple):
    op: str  # name[.variant]
    dtype: str  # "torch.float32"
    sample: int
    outcome: str  # an Outcome's value
    detail: str


ROWS = pytest.StashKey[list[Row]]()  # config.stash: every row of this process (the controller: of all workers)


def row(result: Any) -> Row:
    """The row of a `harness.Result`."""
    return Row(result.op, str(result.dtype), result.sample, result.outcome.value, result.detail)


def summary(rows: Iterable[Row]) -> str:
    """Samples matching / total by dtype, then every sample that did not match (sorted: workers
    finish in any order)."""
    rows = sorted(rows)
    lines = ["OpInfo samples through torch.compile(backend='vfuse'):"]
    for dtype in sorted({r.dtype for r in rows}):
        counts = Counter(Outcome(r.outcome) for r in rows if r.dtype == dtype)
        total = sum(counts.values())
        ok = counts[Outcome.MATCH] + counts[Outcome.NEAR_REFERENCE] + counts[Outcome.EAGER_GRAPH]
        lines.append(
            f"  {dtype.removeprefix('torch.')}: {ok}/{total} match ({100 * ok / max(total, 1):.2f} %), "
            f"of which {counts[Outcome.NEAR_REFERENCE]} only as close to float64 as eager, "
            f"{counts[Outcome.EAGER_GRAPH]} ran eagerly with a warning; "
            f"{counts[Outcome.MISMATCH]} mismatches, {counts[Outcome.CRASH]} crashes"
        )
    shown = (Outcome.MATCH.value, Outcome.NEAR_REFERENCE.value)
    lines += [f"  {r.op} {r.dtype} {r.outcome}: {r.detail}" for r in rows if r.outcome not in shown]
    return "\n".join(lines)
