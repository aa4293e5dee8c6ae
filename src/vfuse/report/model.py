"""What a fusion report holds: the kernels that run, the planner's decisions and whole-graph totals.

A `FusionReport` is plain data read off the IR graph, the `FusionPlan` and the schedule's
`Program`; rendering it as text, JSON, HTML or Graphviz lives in sibling modules so that this
record stays easy to test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vfuse.fusion.plan import Decision, FusionPlan
from vfuse.ir import Graph, Kind
from vfuse.report.modules import Source
from vfuse.report.rows import KernelRow, RunKind
from vfuse.report.units import op_label


@dataclass(frozen=True)
class FusionReport:
    """What vfuse runs for one graph, and why.

    kernels: what runs, in order: the schedule's generated kernels and torch steps (a planner
        group may run as several kernels); with the reference executor, every op through torch.
    num_ops: compute nodes of the graph (not inputs or constants).
    bytes_unfused: every compute op reading its inputs from and writing its output to DRAM.
    bytes_fused: the sum of the kernels' predicted DRAM traffic.
    bytes_lower_bound: graph inputs and constants that are read (once) plus graph outputs
        written once: no schedule can move less.
    time_unfused_s / time_fused_s: predicted time with one kernel per op / of the kernels that
        run; None when the cost model cannot price them (the report never invents a figure).
    fallbacks: torch ops run through the OPAQUE fallback, with how many times each occurs.
    backend: "cpp" (generated C++), "triton" (generated Triton) or "interp" (the reference executor runs every op).
    isa: the CPU instruction-set tier the kernels are built for ("avx512 (vbmi, vnni)"; "" for a GPU).
    native_calls: native entry points called per run (one per segment of consecutive kernels).
    sources: where each IR node came from in the model (module path, class, source line).
    source: the generated C++ translation unit ("" when nothing is generated).
    note: why the reference executor runs the graph, when code generation could not schedule it.
    symbols / guards / flips: with symbolic sizes, the symbols (hint, range), the conditions the
        program holds under (none: every size), and fusion decisions that change within the range.
    """

    target: str
    graph: Graph = field(repr=False)
    plan: FusionPlan = field(repr=False)
    kernels: tuple[KernelRow, ...]
    decisions: tuple[Decision, ...] = field(repr=False)
    num_ops: int
    bytes_unfused: int
    bytes_fused: int
    bytes_lower_bound: int
    time_unfused_s: float | None
    time_fused_s: float | None
    fallbacks: dict[str, int]
    backend: str = "cpp"
    isa: str = ""
    native_calls: int = 0
    sources: Mapping[str, Source] = field(default_factory=dict, repr=False)
    source: str = field(default="", repr=False)
    note: str = ""
    # Symbolic sizes (`dynamic_shapes`, ir/sym.py): each symbol with its hint and range, what the
    # program specialized on (its guards), and merges decided otherwise elsewhere in the range.
    symbols: tuple[str, ...] = ()
    guards: tuple[str, ...] = ()
    flips: tuple[str, ...] = ()
    _by_node: dict[str, tuple[KernelRow, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_node: dict[str, list[KernelRow]] = {}
        for k in self.kernels:
            for n in k.nodes:
                by_node.setdefault(n, []).append(k)
        object.__setattr__(self, "_by_node", {n: tuple(ks) for n, ks in by_node.items()})

    @property
    def num_kernels(self) -> int:
        """Generated kernels that run (what `CompiledGraph.stats.kernels` counts)."""
        return sum(1 for k in self.kernels if k.runs is not RunKind.TORCH)

    @property
    def torch_calls(self) -> int:
        """IR nodes run through torch per run (what `CompiledGraph.stats.torch_calls` counts)."""
        return sum(len(k.nodes) for k in self.kernels if k.runs is RunKind.TORCH)

    @property
    def num_groups(self) -> int:
        """The planner's kernel groups (before code generation splits any)."""
        return len(self.plan.groups)

    @property
    def split_groups(self) -> dict[int, tuple[int, ...]]:
        """Planner groups that run as several kernels (code generation splits them), with those kernels' ids."""
        by_group: dict[int, list[int]] = {}
        for k in self.kernels:
            by_group.setdefault(k.group, []).append(k.id)
        return {g: tuple(ids) for g, ids in by_group.items() if len(ids) > 1}

    @property
    def accepted(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.accepted)

    @property
    def rejected(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.accepted)

    def kernels_of(self, node: str) -> tuple[KernelRow, ...]:
        """Every kernel that computes `node`: none for inputs and constants, several when a
        cheap producer is recomputed inside each consumer's kernel."""
        return self._by_node.get(node, ())

    def kernel_of(self, node: str) -> KernelRow | None:
        """The first kernel that computes `node`, or None for inputs and constants."""
        kernels = self.kernels_of(node)
        return kernels[0] if kernels else None

    @property
    def recomputed(self) -> dict[str, tuple[int, ...]]:
        """Nodes computed in more than one kernel, with those kernels' ids."""
        return {n: tuple(k.id for k in ks) for n, ks in self._by_node.items() if len(ks) > 1}

    @property
    def lowering_choices(self) -> dict[str, str]:
        """Forms the lowering chose with the target's figures, recorded on the nodes it emitted (attr
        `form`: a conv's data gradient, `frontend/conv_dgrad_cost.py`): FX node -> the choice."""
        return {n.origin or n.name: str(n.attrs["form"]) for n in self.graph.nodes if "form" in n.attrs}

    def edge_kind(self, producer: str, consumer: str) -> str:
        """How the value `producer` reaches `consumer`: "fused" (one kernel computes both, so the
        value stays on chip), "dram" (written to memory by one kernel, read by another) or
        "input" (a graph input or constant read from memory)."""
        if self.graph[producer].kind is Kind.SOURCE:
            return "input"
        return "fused" if self.shared_kernel(producer, consumer) is not None else "dram"

    def shared_kernel(self, producer: str, consumer: str) -> KernelRow | None:
        """The first kernel that computes both values, if any."""
        theirs = {k.id for k in self.kernels_of(consumer)}
        return next((k for k in self.kernels_of(producer) if k.id in theirs), None)

    def module_of(self, node: str) -> str:
        """The module path `node` came from ("" when unknown)."""
        src = self.sources.get(node)
        return src.label if src is not None else ""

    def op_chain(self, kernel: KernelRow) -> str:
        """A kernel's ops in order as one readable string: "matmul > add > gelu"."""
        return " > ".join(op_label(self.graph[n]) for n in kernel.nodes)

    def kernel_source(self, kernel: KernelRow) -> str:
        """The generated C++ of `kernel` (its function and the template functions it calls)."""
        from vfuse.report.source import kernel_source

        return kernel_source(self.source, kernel.name, tuple(k.name for k in self.kernels))

    @property
    def profiled(self) -> bool:
        """Whether kernels carry measured times (`with_measured`)."""
        return any(k.measured_s is not None for k in self.kernels)

    @property
    def time_measured_s(self) -> float | None:
        """The kernels' measured times summed (None unless every kernel was measured)."""
        times = [k.measured_s for k in self.kernels]
        return None if not times or None in times else sum(t for t in times if t is not None)

    def with_measured(self, measured: Mapping[str, float] | Sequence[Any]) -> FusionReport:
        """This report with each kernel's measured time: a mapping from kernel name, or the rows
        of `CompiledGraph.profile` (anything with `.name` and `.measured_s`; their `.best_s`, the
        fastest run, is kept too where they have one). The compiled graph must run the kernels
        reported: a name the report lacks raises ValueError."""
        if isinstance(measured, Mapping):
            times, best = dict(measured), {}
        else:
            times = {r.name: r.measured_s for r in measured}
            best = {r.name: r.best_s for r in measured if getattr(r, "best_s", 0.0)}
        names = {k.name for k in self.kernels}
        if set(times) != names:
            raise ValueError(
                f"profile does not match the report: kernels {sorted(set(times) ^ names)} are in only one of them"
            )
        kernels = tuple(replace(k, measured_s=times[k.name], best_s=best.get(k.name)) for k in self.kernels)
        return replace(self, kernels=kernels)

    def to_text(self, width: int = 120, summary: bool = False) -> str:
        """Tables as plain text; `summary`: the totals and one line per kernel, no decision log."""
        from vfuse.report.text import render_text

        return render_text(self, width=width, summary=summary)

    def __str__(self) -> str:
        return self.to_text()

    def to_json(self) -> dict[str, Any]:
        """Everything the report says as plain JSON-able data (`vfuse explain --json`)."""
        from vfuse.report.data import report_data

        return report_data(self)

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
