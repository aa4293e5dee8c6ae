"""The cost model's price of an interleave's gathered loads (fusion/gathers.py, cost.gather_flops):
a RESHAPE merging a CAT's last axis into a longer last axis (a strided conv's data gradient
interleaving its phases) loads every piece's taps at every point, lane by lane, unless the
schedule splits the loop by phase (up to MAX_RESIDUE phases: schedule/residue.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.fusion.fusion_patterns import FIXED_CPU

from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.fusion import estimate, plan_fusion
from vfuse.fusion.cost import GATHER_LANE_SLOTS, gather_flops
from vfuse.fusion.gathers import MAX_RESIDUE, interleave_loads, interleave_sites
from vfuse.ir import Graph, verify
from vfuse.targets import get_target

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fixed_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data gradient's form (GEMM + col2im, whose interleave these tests count, or a conv per
    phase) is priced with the target's figures: fixed ones, not this machine's (on a 48 KiB-L1,
    2 MiB-L2 Xeon the phases won 3x3 stride (1, 2))."""
    monkeypatch.setattr("vfuse.frontend.emitter.get_target", lambda *args, **kwargs: FIXED_CPU)


def _dgrad_graph(c: int, hw: tuple[int, int], k: tuple[int, int], s: tuple[int, int], p: tuple[int, int]) -> Graph:
    x, w = torch.randn(2, c, *hw), torch.randn(5, c, *k)
    go = torch.randn_like(F.conv2d(x, w, None, s, p))

    def fn(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return aten.convolution_backward(
            go, x, w, None, list(s), list(p), [1, 1], False, [0, 0], 1, [True, False, False]
        )[0]

    return verify(lower(trace_aten(fn, (go, x, w)), Context()))


def _loads(graph: Graph) -> list[int]:
    return sorted(n for n in (interleave_sites(v, graph) for v in graph.compute_nodes) if n)


@pytest.mark.parametrize(
    ("k", "s", "p", "want"),
    [
        # 3x3 stride 2 padding 1: phases (even, even) 1 tap, (even, odd) and (odd, even) 2, (odd, odd) 4
        ((3, 3), (2, 2), (1, 1), [9]),
        ((3, 3), (1, 2), (1, 1), [9]),  # only the columns interleave: each row has its 3 taps per phase
        ((2, 3), (2, 2), (0, 1), [6]),  # every tap lands on one phase
    ],
)
def test_an_interleaved_data_gradient_counts_its_taps(k, s, p, want) -> None:
    assert _loads(_dgrad_graph(7, (17, 11), k, s, p)) == want


def test_row_interleave_and_stride_one_gather_nothing() -> None:
    """Phases interleaved along rows only keep the column loads contiguous; stride 1 has no phases."""
    assert _loads(_dgrad_graph(3, (9, 7), (3, 3), (2, 1), (1, 1))) == []
    assert _loads(_dgrad_graph(3, (9, 7), (3, 3), (1, 1), (1, 1))) == []


def test_a_stack_along_a_leading_axis_is_not_an_interleave() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a, b], dim=0).reshape(2, 6 * 5) * 2

    graph = verify(lower(trace_aten(fn, (torch.randn(3, 2, 5), torch.randn(3, 2, 5))), Context()))
    assert _loads(graph) == []


@pytest.mark.parametrize("stride", [2, 3, MAX_RESIDUE, MAX_RESIDUE + 1])
def test_only_an_interleave_the_schedule_does_not_split_is_charged(stride: int) -> None:
    """Up to MAX_RESIDUE phases the schedule splits the loop (contiguous loads: no charge); past
    it every site gathers. Stride s > 3 with a 3-wide kernel: 3 column phases hold 3 row taps."""
    graph = _dgrad_graph(3, (9, 23), (3, 3), (1, stride), (1, 1))
    sites = [interleave_sites(v, graph) for v in graph.compute_nodes if interleave_sites(v, graph)]
    loads = [interleave_loads(v, graph) for v in graph.compute_nodes if interleave_sites(v, graph)]
    assert sites == [9]
    assert loads == ([0] if stride <= MAX_RESIDUE else [9])


def test_the_col2im_kernel_is_priced_with_its_gathers_consistently() -> None:
    """An interleave the schedule does not split pays loads * lanes * slots flops per point on a
    CPU, none on a GPU, and the planner's compositional figures equal the exact model's."""
    s = MAX_RESIDUE + 1
    graph = _dgrad_graph(7, (17, 23), (3, 3), (1, s), (1, 1))
    (node,) = [v for v in graph.compute_nodes if interleave_loads(v, graph)]
    assert gather_flops(node, graph, FIXED_CPU) == 9 * FIXED_CPU.simd_lanes * GATHER_LANE_SLOTS
    assert gather_flops(node, graph, get_target("h100")) == 0
    plan = plan_fusion(graph, FIXED_CPU)
    (group,) = [g for g in plan.groups if node.name in g.nodes]
    exact = estimate(list(group.nodes), graph, FIXED_CPU, outputs=group.outputs)
    assert (group.cost.flops, group.cost.bytes) == (exact.flops, exact.bytes)
    if group.cost.pressure == exact.pressure:
        assert group.cost.time_s == pytest.approx(exact.time_s, rel=1e-9)
    points = 2 * 7 * 17 * 23  # the kernel's domain: the gradient cut to the input's size
    assert group.cost.flops >= 9 * FIXED_CPU.simd_lanes * GATHER_LANE_SLOTS * points
