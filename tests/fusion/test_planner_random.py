"""Random model-like graphs: every plan is valid (legal kernels, acyclic order, all outputs)."""

from __future__ import annotations

import pytest
from benchmarks.plan_bench import random_graph
from tests.fusion.fusion_patterns import FIXED_CPU, check_plan

from vfuse.fusion import estimate, plan_fusion
from vfuse.ir import verify
from vfuse.targets import get_target


@pytest.mark.parametrize("window", [8, 50])
@pytest.mark.parametrize("seed", range(4))
def test_random_graph_plan_is_valid(seed: int, window: int) -> None:
    graph = verify(random_graph(400, seed, window))
    for target in (FIXED_CPU, get_target("h100")):
        plan = plan_fusion(graph, target)
        check_plan(plan)
        assert len(plan.groups) < len(graph.compute_nodes) / 3  # it does fuse
        merged = sum(d.accepted for d in plan.decisions)
        assert merged >= len(graph.compute_nodes) - len(plan.groups)


@pytest.mark.parametrize("seed", range(3))
def test_planned_figures_match_the_exact_model(seed: int) -> None:
    """The planner scores kernels from compositional summaries; their flops and bytes must be
    those of the exact node-level model, and so must the time where the (bounded) on-chip
    pressure figures agree."""
    graph = verify(random_graph(300, seed))
    plan = plan_fusion(graph, FIXED_CPU)
    for g in plan.groups:
        exact = estimate(list(g.nodes), graph, FIXED_CPU, outputs=g.outputs)
        assert (g.cost.flops, g.cost.bytes) == (exact.flops, exact.bytes), g.label
        assert g.cost.parallelism == pytest.approx(exact.parallelism)
        if g.cost.pressure == exact.pressure:
            assert g.cost.time_s == pytest.approx(exact.time_s, rel=1e-9)
