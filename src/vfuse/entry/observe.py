"""What the entry points tell a user about the graphs they compile: log lines, a warning per torch
fallback op, and the weak registry behind `vfuse.compiled_graphs()`, `vfuse.last_compiled()` and
`vfuse.stats()`.

Logging goes to the `vfuse` logger, registered with torch's logging so that `TORCH_LOGS` controls it:
  TORCH_LOGS=vfuse    one INFO line per compiled graph (kernels, torch calls, compile time)
  TORCH_LOGS=+vfuse   DEBUG: also each graph's optimized IR, fusion plan and generated C++
  vfuse.set_logs(output_code=True)   only the generated C++ (likewise graph=, plan=; `set_logs` below)
The artifacts (vfuse_graph, vfuse_plan, vfuse_output_code) cannot be named in TORCH_LOGS: torch
parses it while it is imported, before vfuse can register them. Without any setting only warnings
show (through Python's last-resort handler, or torch's handler once torch's logging is configured).

Process-wide, by design (these are diagnostics, not compiler state): the torch ops already warned
about (each is warned about once per process), weak references to the compiled graphs (a graph
leaves the registry when whoever called it drops it), and a count of graphs that ran eagerly.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch._logging._internal import getArtifactLogger, register_artifact, register_log

from vfuse.context import Context
from vfuse.fusion import format_plan
from vfuse.ir import format_graph
from vfuse.runtime.compiled import CompiledGraph

register_log("vfuse", "vfuse")
_ARTIFACTS = {
    "vfuse_graph": "vfuse's optimized IR of each graph it compiles",
    "vfuse_plan": "vfuse's fusion plan (kernel groups and decisions) of each graph it compiles",
    "vfuse_output_code": "the C++ vfuse generated for each graph it compiles",
}
for _name, _description in _ARTIFACTS.items():
    register_artifact(_name, _description)

log = logging.getLogger("vfuse")
_artifact_logs = {name: getArtifactLogger(__name__, name) for name in _ARTIFACTS}

_warned: set[str] = set()  # torch ops already warned about in this process
_graphs: weakref.WeakValueDictionary[int, CompiledGraph] = weakref.WeakValueDictionary()
_counts = Counter[str]()  # "eager": graphs that failed to compile and ran eagerly; "reused": see FixedGraphs


def compiled(graph: CompiledGraph, ctx: Context, kind: str) -> None:
    """Record a graph an entry point compiled: registry, INFO line, artifacts, fallback warnings."""
    if ctx.serial is not None:
        _graphs[ctx.serial] = graph
    if log.isEnabledFor(logging.INFO):
        log.info("vfuse: %s", describe(graph, ctx, kind))
    _log_artifacts(graph, ctx)
    warn_fallbacks(graph.stats.fallbacks, ctx)


def ran_eagerly() -> None:
    """Count a graph that failed to compile (the backend has warned already)."""
    _counts["eager"] += 1


def reused() -> None:
    """Count a graph with symbolic sizes that reused a fixed-shape one instead of compiling."""
    _counts["reused"] += 1


def describe(graph: CompiledGraph, ctx: Context, kind: str) -> str:
    """One line: which graph, what runs natively, what through torch, how long it took to compile."""
    s = graph.stats
    where = "on the reference executor" if s.backend == "interp" else f"in {_count(s.kernels, 'native kernel')}"
    ops = _count(len(graph.graph.compute_nodes), "op")
    torch_ops = _ops_text(s.fallbacks)
    return (
        f"{kind} graph #{ctx.serial} ({ctx.graph_id}) compiled in {graph.compile_s * 1e3:.1f} ms: {ops} {where}, "
        f"{_count(s.torch_calls, 'torch call')}{f' ({torch_ops} not compiled)' if torch_ops else ''}"
    )


def _log_artifacts(graph: CompiledGraph, ctx: Context) -> None:
    texts = {
        "vfuse_graph": lambda: format_graph(graph.graph),
        "vfuse_plan": lambda: format_plan(graph.plan),
        "vfuse_output_code": lambda: getattr(graph.executor, "source", "") or "(no native code)",
    }
    for name, text in texts.items():
        artifact = _artifact_logs[name]
        if artifact.isEnabledFor(logging.DEBUG):
            artifact.debug("%s of graph #%s (%s):\n%s", name, ctx.serial, ctx.graph_id, text())


def set_logs(
    level: int | None = logging.INFO, *, graph: bool = False, plan: bool = False, output_code: bool = False
) -> None:
    """Show vfuse's log at `level` (None: leave it off) and the artifacts asked for, through
    `torch._logging.set_logs` (which, like it, replaces earlier settings; a no-op under TORCH_LOGS)."""
    import torch._logging

    wanted = {"vfuse_graph": graph, "vfuse_plan": plan, "vfuse_output_code": output_code}
    modules: dict[str, Any] = {name: True for name, on in wanted.items() if on}
    if level is not None:
        modules["vfuse"] = level
    torch._logging.set_logs(modules=modules)


def warn_fallbacks(fallbacks: Iterable[str], ctx: Context) -> None:
    """Warn (through the `vfuse` logger) the first time this process runs a torch op through torch."""
    for op in sorted(set(fallbacks) - _warned):
        _warned.add(op)
        log.warning(
            "vfuse: %s runs through torch, not compiled (first in graph #%s, %s); "
            "told once per process, vfuse.stats() counts every use",
            op,
            ctx.serial,
            ctx.graph_id,
        )


def _ops_text(counts: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items()))


@dataclass(frozen=True)
class CompileStats:
    """Totals over compiled graphs; `str()` gives a readable summary."""

    graphs: int  # compiled graphs counted
    kernels: int  # native kernels in them
    torch_calls: int  # ops each run of all of them hands to torch
    fallbacks: dict[str, int]  # of those, the ops vfuse does not compile, by torch op name
    reference_graphs: int  # graphs on the reference executor: their native code could not be built
    eager_graphs: int  # graphs that failed to compile and run eagerly
    reused_graphs: int  # graphs with symbolic sizes that reused a fixed-shape graph
    compile_s: float  # time spent compiling them
    # Graphs that ran CUDA calls (backend="triton"): "captured" or why they run uncaptured -> graphs.
    cuda_graphs: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(graphs: Sequence[CompiledGraph], eager_graphs: int = 0, reused_graphs: int = 0) -> CompileStats:
        fallbacks: Counter[str] = Counter()
        for g in graphs:
            fallbacks.update(g.stats.fallbacks)
        return CompileStats(
            graphs=len(graphs),
            kernels=sum(g.stats.kernels for g in graphs),
            torch_calls=sum(g.stats.torch_calls for g in graphs),
            fallbacks=dict(sorted(fallbacks.items())),
            reference_graphs=sum(1 for g in graphs if g.stats.native_error),
            eager_graphs=eager_graphs,
            reused_graphs=reused_graphs,
            compile_s=sum(g.compile_s for g in graphs),
            cuda_graphs=dict(Counter(g.stats.cuda_graphs.blocker or "captured" for g in graphs if g.stats.cuda_graphs)),
        )

    def __str__(self) -> str:
        lines = [
            f"{_count(self.graphs, 'graph')} compiled in {self.compile_s:.2f} s: "
            f"{_count(self.kernels, 'native kernel')}, {_count(self.torch_calls, 'torch call')} per run"
        ]
        if self.fallbacks:
            lines.append(f"not compiled, run through torch: {_ops_text(self.fallbacks)}")
        if self.reference_graphs:
            lines.append(f"{_count(self.reference_graphs, 'graph')} on the reference executor (no native code)")
        if self.eager_graphs:
            lines.append(f"{_count(self.eager_graphs, 'graph')} failed to compile and ran eagerly")
        if self.reused_graphs:
            lines.append(f"{_count(self.reused_graphs, 'graph')} with symbolic sizes reused a compiled one")
        for why, n in sorted(self.cuda_graphs.items()):
            state = "captured" if why == "captured" else f"not captured ({why})"
            lines.append(f"CUDA graphs: {_count(n, 'graph')} {state}")
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs the entry points compiled in this process that are still in use, oldest first."""
    return [g for _, g in sorted(_graphs.items())]


def last_compiled() -> CompiledGraph | None:
    """The most recently compiled graph still in use, or None."""
    graphs = compiled_graphs()
    return graphs[-1] if graphs else None


def stats() -> CompileStats:
    """Totals over `compiled_graphs()`; eager_graphs and reused_graphs count this whole process."""
    return CompileStats.of(compiled_graphs(), eager_graphs=_counts["eager"], reused_graphs=_counts["reused"])
