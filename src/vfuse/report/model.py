"""What a fusion report holds: per-kernel rows, the planner's decisions and whole-graph totals.

A `FusionReport` is plain data read off the IR graph and the `FusionPlan`; rendering it as
text, HTML or Graphviz lives in sibling modules so that this record stays easy to test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vfuse.fusion.plan import Decision, FusionPlan
from vfuse.ir import Graph, Kind
from vfuse.report.units import op_label


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One kernel (a planner Group) as the report shows it.

    ops: op names of the group's nodes, in the same order as `nodes` (`op_label` spells out
        which torch op a fallback calls).
    kind: the group's dominant op kind (lower-case Kind name); label: the planner's kernel label.
    bytes: unique DRAM traffic the cost model predicts for the fused kernel.
    """

    id: int
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    kind: str
    label: str
    time_s: float
    flops: int
    bytes: int
    bound: str
    pressure: float
    parallelism: float
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class FusionReport:
    """The explanation of one fusion plan.

    num_ops: compute nodes of the graph (not inputs or constants).
    bytes_unfused: every compute op reading its inputs from and writing its output to DRAM.
    bytes_fused: the sum of the kernels' predicted DRAM traffic.
    bytes_lower_bound: graph inputs and constants that are read (once) plus graph outputs
        written once: no schedule can move less.
    time_unfused_s: predicted time with one kernel per op; None when the cost model that
        would give it is not available (the report never invents it).
    fallbacks: torch ops run through the OPAQUE fallback, with how many times each occurs.
    """

    target: str
    graph: Graph = field(repr=False)
    plan: FusionPlan = field(repr=False)
    groups: tuple[KernelRow, ...]
    decisions: tuple[Decision, ...]
    num_ops: int
    bytes_unfused: int
    bytes_fused: int
    bytes_lower_bound: int
    time_unfused_s: float | None
    time_fused_s: float
    fallbacks: dict[str, int]
    _by_node: dict[str, tuple[KernelRow, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_node: dict[str, list[KernelRow]] = {}
        for g in self.groups:
            for n in g.nodes:
                by_node.setdefault(n, []).append(g)
        object.__setattr__(self, "_by_node", {n: tuple(gs) for n, gs in by_node.items()})

    @property
    def num_kernels(self) -> int:
        return len(self.groups)

    @property
    def accepted(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.accepted)

    @property
    def rejected(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.accepted)

    def groups_of(self, node: str) -> tuple[KernelRow, ...]:
        """Every kernel that computes `node`: none for inputs and constants, several when the
        planner recomputes a cheap producer inside each consumer's kernel."""
        return self._by_node.get(node, ())

    def group_of(self, node: str) -> KernelRow | None:
        """The first kernel that computes `node`, or None for inputs and constants."""
        groups = self.groups_of(node)
        return groups[0] if groups else None

    @property
    def recomputed(self) -> dict[str, tuple[int, ...]]:
        """Nodes computed in more than one kernel, with those kernels' ids."""
        return {n: tuple(g.id for g in gs) for n, gs in self._by_node.items() if len(gs) > 1}

    def edge_kind(self, producer: str, consumer: str) -> str:
        """How the value `producer` reaches `consumer`: "fused" (one kernel computes both, so the
        value stays on chip), "dram" (written to memory by one kernel, read by another) or
        "input" (a graph input or constant read from memory)."""
        if self.graph[producer].kind is Kind.SOURCE:
            return "input"
        return "fused" if self.shared_group(producer, consumer) is not None else "dram"

    def shared_group(self, producer: str, consumer: str) -> KernelRow | None:
        """The first kernel that computes both values, if any."""
        theirs = {g.id for g in self.groups_of(consumer)}
        return next((g for g in self.groups_of(producer) if g.id in theirs), None)

    def op_chain(self, group: KernelRow) -> str:
        """A kernel's ops in order as one readable string: "matmul > add > gelu"."""
        return " > ".join(op_label(self.graph[n]) for n in group.nodes)

    def to_text(self, width: int = 120) -> str:
        from vfuse.report.text import render_text

        return render_text(self, width=width)

    def __str__(self) -> str:
        return self.to_text()

    def to_dot(self) -> str:
        from vfuse.report.dot import render_dot

        return render_dot(self)

    def to_html(self, path: str | Path | None = None) -> str:
        """Render one self-contained HTML page; also write it to `path` when given."""
        from vfuse.report.html import render_html

        page = render_html(self)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page
