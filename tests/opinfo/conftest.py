"""Collects every OpInfo result of the session; tests/conftest.py prints the pass rates at the end
(gathered from every pytest-xdist worker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.opinfo.harness import Result
from tests.opinfo.records import ROWS, row


@pytest.fixture
def opinfo_log(request: pytest.FixtureRequest) -> Iterator[list[Result]]:
    results: list[Result] = []
    yield results
    request.config.stash.setdefault(ROWS, []).extend(row(r) for r in results)
