"""Short rows walked ROW_GROUP at a time (codegen/cpp/rowgroups.py): full and partial last
groups, a row-level output (the mean) and RMSNorm rows match the reference; long rows keep
the row-at-a-time walk."""

from __future__ import annotations

import pytest
import torch
from tests.codegen.native_helpers import check, hand_plan
from tests.codegen.test_views_and_reductions import norm_graph

from vfuse.codegen.cpp.rowgroups import ROW_GROUP


@pytest.mark.parametrize("n", [8 * ROW_GROUP, 8 * ROW_GROUP + 1, 8 * ROW_GROUP + ROW_GROUP - 1])
@pytest.mark.parametrize("kind", ["layernorm", "rms"])
def test_row_groups_match(kind: str, n: int) -> None:
    graph, _ = norm_graph(kind, n, 256)
    plan = hand_plan(graph, [[nd.name for nd in graph.compute_nodes]])
    ex = check(graph, [torch.randn(n, 256) * 4 + 1, torch.randn(256), torch.randn(256)], plan)
    assert "_rg[" in ex.source


def test_long_rows_keep_one_row_at_a_time() -> None:
    graph, _ = norm_graph("layernorm", 16, 1024)
    plan = hand_plan(graph, [[nd.name for nd in graph.compute_nodes]])
    ex = check(graph, [torch.randn(16, 1024), torch.randn(1024), torch.randn(1024)], plan)
    assert "_rg[" not in ex.source
