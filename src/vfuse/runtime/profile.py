"""Per-kernel profiler of a native CompiledGraph: what each generated kernel and each torch step
takes, next to what the cost model predicted for it.

The calls a user makes run the normal build, untouched. Profiling builds the same Program once
more with `Program.profiled` set: the renderer then adds, per segment, an entry that reads the
monotonic clock around every kernel it runs (`codegen/cpp/function.render_profiled_entry`), so a
kernel's time includes its OpenMP fork/join but not the Python call into the segment. Torch steps
are timed in Python around the step. Each rep runs the whole graph once; after `warmup` reps, a
kernel's measured time is the median of its `reps` samples.

Rows are named as the report names them (`k2_c`, `torch3`), in run order, and predicted exactly as
the report predicts them: a kernel that is its planner group keeps the group's cost, a kernel
split off a group or a torch step is priced by the same cost model on its own nodes.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from vfuse.codegen.cpp import render
from vfuse.codegen.cpp.function import PROFILED_SUFFIX
from vfuse.codegen.cpp.toolchain import find_toolchain, load_library
from vfuse.errors import VfuseError
from vfuse.fusion.cost import estimate
from vfuse.fusion.plan import Cost, Group
from vfuse.runtime.omp_start import start_torch_threads
from vfuse.schedule import Program, Segment, TorchStep
from vfuse.schedule.contents import computed, stored
from vfuse.schedule.kernel import AnyKernel, ContractionKernel
from vfuse.targets import DEFAULT_CACHE_DIR, Target, get_target
from vfuse.targets.calibrate import at_threads

if TYPE_CHECKING:
    from vfuse.runtime.native import NativeExecutor


@dataclass(frozen=True, slots=True)
class KernelProfile:
    """One kernel or torch step of a profiled graph, in run order.

    name: the generated C++ function (`k2_c`) or `torch<id>`, as in the report; runs: native,
    template or torch; kind/label: its planner group's; predicted_s: the cost model's time (None
    when it cannot price the nodes); measured_s: median over the reps; flops/bytes/bound: the
    cost model's figures for exactly these nodes.
    """

    id: int
    name: str
    runs: str
    segment: str
    kind: str
    label: str
    nodes: tuple[str, ...]
    predicted_s: float | None
    measured_s: float
    flops: int
    bytes: int
    bound: str
    best_s: float = 0.0  # the fastest rep (on a loaded machine a preempted thread inflates the median)

    @property
    def ratio(self) -> float | None:
        """predicted / measured (None without a prediction)."""
        if self.predicted_s is None or self.measured_s <= 0:
            return None
        return self.predicted_s / self.measured_s

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__} | {"ratio": self.ratio}  # type: ignore[attr-defined]


def _timed_entries(program: Program, library: ctypes.CDLL) -> Timed:
    """Each segment's timing entry and the array it writes kernel nanoseconds to."""
    timed = {}
    for seg in program.segments:
        fn = getattr(library, seg.name + PROFILED_SUFFIX)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        timed[seg.name] = (fn, (ctypes.c_int64 * len(seg.kernels))())
    return timed


Timed = dict[str, tuple[Any, Any]]


def timing_executor(executor: NativeExecutor) -> tuple[NativeExecutor, Timed]:
    """An executor of `executor`'s Program built once more with per-kernel clocks (through the
    kernel cache). Made as `type(executor)`: this module sits below the executor in the imports."""
    program = replace(executor.program, profiled=True)
    source = render(program)
    library = load_library(source, executor.cache_dir or DEFAULT_CACHE_DIR, find_toolchain(isa=program.isa))
    timing = type(executor)(executor.plan, program, source, library, static_outputs=True, cache_dir=executor.cache_dir)
    return timing, _timed_entries(program, library)


def run_timed(
    ex: NativeExecutor, timed: Timed, inputs: Sequence[torch.Tensor]
) -> tuple[list[float], list[torch.Tensor]]:
    """Run the timing build once (the general call path): the seconds of each kernel and torch
    step in run order, and the graph's outputs."""
    env = ex._prepare(inputs)
    assert ex._arena is not None
    arena = ex._arena.data_ptr() + ex._arena_off
    nt = torch.get_num_threads()
    start_torch_threads(nt)
    times: list[float] = []
    for step in ex.program.steps:
        if isinstance(step, Segment):
            ex._bind(step, env)
            fn, ns = timed[step.name]
            if fn(ex._ptrs, arena, ex._seeds.data_ptr(), nt, ctypes.addressof(ns)):
                raise ex._fault()
            times += [t * 1e-9 for t in ns]
        else:
            t0 = time.perf_counter_ns()
            ex._run_torch(step, env)
            times.append((time.perf_counter_ns() - t0) * 1e-9)
    return times, [ex._result(o, env) for o in ex.graph.outputs]


def measure(
    executor: NativeExecutor, inputs: Sequence[torch.Tensor], reps: int, warmup: int = 2
) -> list[tuple[float, float]]:
    """(median, best) seconds of every kernel and torch step of `executor`'s Program, in run order."""
    if reps < 1:
        raise ValueError(f"profile: reps must be >= 1, got {reps}")
    timing, timed = timing_executor(executor)
    for _ in range(warmup):
        run_timed(timing, timed, inputs)
    samples = [run_timed(timing, timed, inputs)[0] for _ in range(reps)]
    return [(statistics.median(s), min(s)) for s in zip(*samples)]


def profile_executor(
    executor: Any, inputs: Sequence[torch.Tensor], reps: int = 20, threads: int | None = None
) -> list[KernelProfile]:
    """One KernelProfile per kernel and torch step of a native executor's Program. With
    `threads`, the kernels run on that many threads (a loaded machine: 1 thread is disturbed
    least) and are priced again for that many cores (`targets.calibrate.at_threads`)."""
    if getattr(executor, "program", None) is None or getattr(executor.stats, "backend", "") != "cpp":
        why = getattr(getattr(executor, "stats", None), "native_error", "") or type(executor).__name__
        raise VfuseError(f"profile: only natively compiled graphs (backend 'cpp') have kernels to time, not {why}")
    if threads is not None and threads < 1:
        raise ValueError(f"profile: threads must be >= 1, got {threads}")
    program = executor.program
    # Inputs the program writes in place (schedule/inplace.py) are timed on copies: profiling
    # leaves no trace.
    written = {executor.graph[x].attrs["index"] for _, x in program.in_place}
    inputs = [t.clone() if i in written else t for i, t in enumerate(inputs)]
    hw = get_target(executor.plan.target, executor.cache_dir, isa=program.isa)
    if threads is not None:
        hw = at_threads(hw, threads)
    before, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        torch.set_num_threads(threads or before)
        measured = measure(executor, inputs, reps)
    finally:
        # Profiling leaves no trace: the thread count, and torch's generator (RNG_SEED draws).
        torch.set_num_threads(before)
        torch.set_rng_state(rng)
    rows = predicted_rows(executor, hw, reprice=threads is not None)
    return [replace(row, measured_s=m, best_s=b) for row, (m, b) in zip(rows, measured, strict=True)]


def predicted_rows(executor: NativeExecutor, target: Target, reprice: bool = False) -> list[KernelProfile]:
    """The rows with the cost model's prediction and measured_s = 0; `reprice`: every kernel
    priced on `target` from its nodes, none keeps its planner group's cost."""
    items: list[tuple[AnyKernel | TorchStep, str]] = []
    for step in executor.program.steps:
        if isinstance(step, Segment):
            items += [(k, step.name) for k in step.kernels]
        else:
            items.append((step, ""))
    per_group: dict[int, int] = {}
    for item, _ in items:
        per_group[item.group] = per_group.get(item.group, 0) + 1
    groups = {g.id: g for g in executor.plan.groups}
    rows = []
    for i, (item, segment) in enumerate(items):
        group = groups[item.group]
        whole = per_group[item.group] == 1 and not reprice
        rows.append(_row(executor, target, i, item, segment, group, whole))
    return rows


def _row(
    ex: NativeExecutor, target: Target, i: int, item: AnyKernel | TorchStep, segment: str, group: Group, whole: bool
) -> KernelProfile:
    graph = ex.graph
    cost: Cost | None
    if isinstance(item, TorchStep):
        nodes, name, runs = tuple(item.nodes), f"torch{i}", "torch"
        cost = group.cost if whole else _sum(graph, nodes, target)
    else:
        nodes, name = computed(graph, item), item.name
        runs = "template" if isinstance(item, ContractionKernel) else "native"
        cost = group.cost if whole else _estimate(graph, nodes, stored(item), target)
    return KernelProfile(
        id=i,
        name=name,
        runs=runs,
        segment=segment,
        kind=group.kind.name.lower(),
        label=group.label,
        nodes=nodes,
        predicted_s=cost.time_s if cost is not None else None,
        measured_s=0.0,
        flops=cost.flops if cost is not None else 0,
        bytes=cost.bytes if cost is not None else 0,
        bound=cost.bound if cost is not None else "unknown",
    )


def _estimate(graph: Any, nodes: Sequence[str], writes: Sequence[str] | None, target: Target) -> Cost | None:
    try:
        return estimate(nodes, graph, target, writes)
    except ValueError:
        return None


def _sum(graph: Any, nodes: Sequence[str], target: Target) -> Cost | None:
    """Torch runs each node as its own kernel: the sum of their costs alone (as the report)."""
    costs = [_estimate(graph, [n], None, target) for n in nodes]
    if any(c is None for c in costs):
        return None
    return Cost.sum_of([c for c in costs if c is not None])
