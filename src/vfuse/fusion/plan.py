"""What the fusion planner produces: kernel groups in execution order and a log of decisions.

This is the contract between the planner (`vfuse.fusion.planner`), the scheduler and code
generators (which turn each Group into one kernel) and the report (which explains them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vfuse.fusion.rules import Rule
from vfuse.ir import Graph, Kind


@dataclass(frozen=True, slots=True)
class Cost:
    """Cost-model figures for one kernel (or one unfused op) on a target, all in SI units."""

    flops: int
    bytes: int  # unique DRAM traffic: inputs read once, materialized outputs written once
    compute_s: float
    memory_s: float
    launch_s: float
    time_s: float  # launch + C + M - gamma * min(C, M), plus penalties below
    pressure: float  # live values per point / registers (GPU) or working set / cache (CPU); >1 spills
    parallelism: float  # independent work items / hardware threads; <1 leaves hardware idle
    # Of compute_s, what only vfuse's contraction template pays (its calibrated per-call and per-element
    # overheads, `cost.template_extra_s`): a library call of the same contraction does not.
    template_s: float = 0.0
    library_extra_s: float = 0.0  # what torch's library pays in its place (its own calibrated overheads)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @staticmethod
    def sum_of(costs: Sequence[Cost]) -> Cost:
        """Separate kernels run one after another (torch running each op alone): figures add up."""
        return Cost(
            sum(c.flops for c in costs),
            sum(c.bytes for c in costs),
            sum(c.compute_s for c in costs),
            sum(c.memory_s for c in costs),
            sum(c.launch_s for c in costs),
            sum(c.time_s for c in costs),
            max((c.pressure for c in costs), default=0.0),
            min((c.parallelism for c in costs), default=1.0),
            sum(c.template_s for c in costs),
            sum(c.library_extra_s for c in costs),
        )


@dataclass(frozen=True, slots=True)
class Group:
    """One kernel: IR nodes (topological) that run together without touching DRAM in between.

    inputs: values read from memory (graph inputs, constants, other groups' outputs).
    outputs: values this kernel writes to memory (read by a later group or a graph output).
    label: what kind of kernel it is: "pointwise", "reduction", "row" (reduction with
        prologue/epilogue in one row pass), "gemm", "conv", "attention", "opaque", "view".
    """

    id: int
    nodes: tuple[str, ...]
    kind: Kind
    label: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost: Cost
    retile: int = 0  # GPU: times its kernel was re-tiled after spilling (fusion/onchip.py, schedule/gpu.py)


@dataclass(frozen=True, slots=True)
class Decision:
    """One candidate merge the planner considered (producer group into consumer group).

    rule: the rule that allowed or forbade it (`fusion.rules.Rule`: its name and meaning).
    gain_s: predicted time saved (t(A) + t(B) - t(A u B)); None when legality rejected it first.
    """

    producer: tuple[str, ...]
    consumer: tuple[str, ...]
    accepted: bool
    rule: Rule
    reason: str
    gain_s: float | None = None
    horizontal: bool = False


@dataclass(frozen=True)
class FusionPlan:
    graph: Graph
    target: str
    groups: tuple[Group, ...]
    decisions: tuple[Decision, ...]

    def group_of(self, node: str) -> Group:
        for g in self.groups:
            if node in g.nodes:
                return g
        raise KeyError(node)
