"""Collects every OpInfo result of the session and prints the pass rates at the end."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from tests.opinfo.harness import Outcome, Result

RESULTS = pytest.StashKey[list]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS] = []


@pytest.fixture
def opinfo_log(request: pytest.FixtureRequest) -> list[Result]:
    return request.config.stash[RESULTS]


def summary(results: list[Result]) -> str:
    """Samples matching / total by dtype, then every sample that did not match."""
    lines = ["OpInfo samples through torch.compile(backend='vfuse'):"]
    for dtype in sorted({r.dtype for r in results}, key=str):
        counts = Counter(r.outcome for r in results if r.dtype == dtype)
        total = sum(counts.values())
        ok = counts[Outcome.MATCH] + counts[Outcome.NEAR_REFERENCE] + counts[Outcome.EAGER_GRAPH]
        lines.append(
            f"  {str(dtype).removeprefix('torch.')}: {ok}/{total} match ({100 * ok / max(total, 1):.2f} %), "
            f"of which {counts[Outcome.NEAR_REFERENCE]} only as close to float64 as eager, "
            f"{counts[Outcome.EAGER_GRAPH]} ran eagerly with a warning; "
            f"{counts[Outcome.MISMATCH]} mismatches, {counts[Outcome.CRASH]} crashes"
        )
    shown = (Outcome.MATCH, Outcome.NEAR_REFERENCE)
    lines += [f"  {r.op} {r.dtype} {r.outcome.value}: {r.detail}" for r in results if r.outcome not in shown]
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS, [])
    if not results:
        return
    text = summary(results)
    terminalreporter.write_line(text)
    if os.environ.get("VFUSE_OPINFO_REPORT"):
        Path(os.environ["VFUSE_OPINFO_REPORT"]).write_text(text + "\n")
