"""vfuse.explain through the real pipeline (torch.export, lowering, passes, planner) on a tiny function."""

from __future__ import annotations

import torch

import vfuse
from vfuse.report import FusionReport


def add_relu_scale(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y) * 2.0


def test_explain_reports_the_plan() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    r = vfuse.explain(add_relu_scale, x, y, target="h100")
    assert isinstance(r, FusionReport)
    assert r.target == r.plan.target == "h100"
    assert r.num_kernels == len(r.plan.groups) >= 1
    assert r.bytes_fused == sum(g.cost.bytes for g in r.plan.groups)
    assert r.bytes_lower_bound == 3 * 4 * 8 * 4  # x and y read once, the result written once
    assert r.bytes_lower_bound <= r.bytes_fused <= r.bytes_unfused
    assert r.time_unfused_s is not None  # the cost model priced every op alone
    assert r.fallbacks == {}
    computed = {n for g in r.groups for n in g.nodes}
    assert {n.name for n in r.graph.compute_nodes} <= computed
    assert "add" in {op for g in r.groups for op in g.ops}
    assert r.num_kernels == 1  # three pointwise ops on one shape: one kernel on any target
