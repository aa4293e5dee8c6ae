"""Run workloads: compile every contender, check it against eager, then time all together."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from vfuse.bench.checks import Check, compare
from vfuse.bench.contenders import INDUCTOR, REFERENCE, Contender
from vfuse.bench.results import ContenderResult, CopyResult, MachineInfo, RunResult, WorkloadResult
from vfuse.bench.timing import Stats, TimingConfig, copy_callables, measure
from vfuse.bench.workloads import Instance, Workload, minimal_bytes

Status = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    """A contender after its first call: the callable to time, or why there is none."""

    name: str
    fn: Callable[[], object] | None
    first_call_s: float | None
    check: Check | None
    error: str | None
    backend_stats: dict[str, Any] | None = None


def _short_error(exc: BaseException) -> str:
    """One line: the root cause (Dynamo wraps backend errors) and where it was raised."""
    root = exc
    # BackendCompilerFailed keeps the backend's exception in `inner_exception`, not always as the cause.
    while (inner := root.__cause__ or getattr(root, "inner_exception", None)) is not None and inner is not root:
        root = inner
    frames = traceback.extract_tb(root.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    wrapper = f"{type(exc).__name__} <- " if root is not exc else ""
    return f"{wrapper}{type(root).__name__}: {' '.join(str(root).split())[:400]}{where}"


def _prepare(contender: Contender, workload: Workload, instance: Instance, expected: Any) -> Prepared:
    """Compile (lazily, on the first call for torch.compile) and check one contender."""
    try:
        compiled = contender.prepare_for(workload.frozen)(instance.module)
        start = time.perf_counter()
        out = compiled.fn(*instance.inputs)
        first_call_s = time.perf_counter() - start
        stats = compiled.stats() if compiled.stats else None
    except Exception as exc:  # a broken contender is a result to report, not a reason to stop
        return Prepared(contender.name, None, None, None, _short_error(exc))
    check = compare(expected, out, workload.rtol, workload.atol)
    return Prepared(contender.name, partial(compiled.fn, *instance.inputs), first_call_s, check, None, stats)


def _recheck(prep: Prepared, workload: Workload, expected: Any) -> Prepared:
    """Check once more after timing: reused buffers or arenas can go wrong only on later calls."""
    if prep.fn is None or prep.check is None or not prep.check.ok:
        return prep
    again = compare(expected, prep.fn(), workload.rtol, workload.atol)
    if again.ok:
        return prep
    return replace(prep, check=replace(again, detail=f"after timing (first call was ok): {again.detail}"))


def _copy_result(stats: dict[str, Stats], traffic: int) -> CopyResult:
    return CopyResult(
        traffic_bytes=traffic,
        prealloc=stats["copy"],
        fresh=stats["copy_fresh"],
        prealloc_gbps=traffic / stats["copy"].median_s / 1e9,
        fresh_gbps=traffic / stats["copy_fresh"].median_s / 1e9,
    )


def _ratio(base: Stats | None, this: Stats | None) -> float | None:
    return None if base is None or this is None else base.median_s / this.median_s


def _contender_result(prep: Prepared, stats: dict[str, Stats], nbytes: int, copy_gbps: float) -> ContenderResult:
    mine = stats.get(prep.name)
    gbps = nbytes / mine.median_s / 1e9 if mine else None
    if prep.error is not None:
        status = "error"
    else:
        status = "ok" if prep.check is not None and prep.check.ok else "mismatch"
    return ContenderResult(
        name=prep.name,
        status=status,
        error=prep.error,
        check=prep.check,
        first_call_s=prep.first_call_s,
        time=mine,
        gbps=gbps,
        pct_copy=100.0 * gbps / copy_gbps if gbps is not None and copy_gbps > 0 else None,
        speedup_vs_eager=_ratio(stats.get(REFERENCE), mine),
        speedup_vs_inductor=_ratio(stats.get(INDUCTOR), mine),
        backend_stats=prep.backend_stats,
    )


def run_workload(
    workload: Workload, contenders: list[Contender], quick: bool, timing: TimingConfig, status: Status
) -> WorkloadResult:
    # Fresh Dynamo state per workload: no cache-size limits or guards carried across workloads.
    torch._dynamo.reset()
    instance = workload.build(quick)
    with torch.no_grad():
        expected = instance.module(*instance.inputs)
        nbytes = minimal_bytes(instance, expected)
        prepared = []
        for contender in contenders:
            status(f"{workload.name}: compile + check {contender.name}")
            prepared.append(_prepare(contender, workload, instance, expected))
        copies, traffic = copy_callables(nbytes)
        fns = {p.name: p.fn for p in prepared if p.fn is not None}
        status(f"{workload.name}: timing {', '.join(fns)} + copy")
        stats = measure({**fns, **copies}, timing)
        status(f"{workload.name}: checking again after timing")
        prepared = [_recheck(p, workload, expected) for p in prepared]
    copy = _copy_result(stats, traffic)
    return WorkloadResult(
        name=workload.name,
        description=workload.description,
        input_shapes=tuple(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in instance.inputs),
        minimal_bytes=nbytes,
        copy=copy,
        contenders=tuple(_contender_result(p, stats, nbytes, copy.prealloc_gbps) for p in prepared),
        frozen=workload.frozen,
    )


def run_all(
    label: str,
    workloads: list[Workload],
    contenders: list[Contender],
    quick: bool,
    timing: TimingConfig,
    status: Status,
    advance: Callable[[], None],
) -> RunResult:
    """One pass over all workloads; `advance` ticks the progress bar after each workload."""
    machine = MachineInfo.probe()  # before we load the machine, so its load average is everyone else's
    results = []
    for workload in workloads:
        results.append(run_workload(workload, contenders, quick, timing, status))
        advance()
    return RunResult(label=label, machine=machine, workloads=tuple(results))
