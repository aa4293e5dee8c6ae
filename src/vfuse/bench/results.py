"""Result records: what one benchmark run measured, and their JSON form.

The JSON written by `--json` is `dataclasses.asdict(BenchReport)`; `from_dict` reads it back,
which is how the `--no-mmap` child hands its run to the parent. Derived figures (GB/s,
ratios) are stored next to the raw samples so readers of the JSON need not recompute them.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import vfuse
from vfuse.bench.checks import Check
from vfuse.bench.timing import Stats
from vfuse.targets.cpu import isa_for, machine_isa

SCHEMA = "vfuse-bench/1"
_SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "asimd", "sve")


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    cpu_simd: tuple[str, ...]
    logical_cpus: int
    threads: int
    torch_version: str
    vfuse_version: str
    python_version: str
    platform: str
    date_utc: str
    glibc_tunables: str | None
    load_avg: tuple[float, float, float]  # 1, 5, 15 min, when the run started: others' load = noise
    isa: str = ""  # the instruction-set tier vfuse compiled for (VFUSE_ISA or the CPU's own), with extensions
    cpu_isa: str = ""  # the CPU's own tier

    @staticmethod
    def probe() -> MachineInfo:
        model, flags = _cpuinfo()
        return MachineInfo(
            isa=isa_for(None).describe(),
            cpu_isa=machine_isa().describe(),
            cpu_model=model,
            cpu_simd=tuple(f for f in _SIMD_FLAGS if f in flags),
            logical_cpus=os.cpu_count() or 0,
            threads=torch.get_num_threads(),
            torch_version=torch.__version__,
            vfuse_version=vfuse.__version__,
            python_version=platform.python_version(),
            platform=platform.platform(),
            date_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            glibc_tunables=os.environ.get("GLIBC_TUNABLES"),
            load_avg=os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0),
        )

    @staticmethod
    def from_dict(data: dict[str, Any]) -> MachineInfo:
        return MachineInfo(**{**data, "cpu_simd": tuple(data["cpu_simd"]), "load_avg": tuple(data["load_avg"])})


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, feature flags) from /proc/cpuinfo; platform's answer where that is missing."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown", set()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.MULTILINE)
    return (model.group(1).strip() if model else platform.processor() or "unknown"), set(
        flags.group(1).split() if flags else ()
    )


@dataclass(frozen=True)
class ContenderResult:
    name: str
    status: str  # "ok", "mismatch" (timed but wrong) or "error" (could not compile or run)
    error: str | None
    check: Check | None
    first_call_s: float | None  # includes compilation for torch.compile contenders
    time: Stats | None
    gbps: float | None  # minimal bytes / median time
    pct_copy: float | None  # gbps as % of the preallocated-copy bandwidth of the same run
    speedup_vs_eager: float | None  # eager median / this median (>1: faster than eager)
    speedup_vs_inductor: float | None
    backend_stats: dict[str, Any] | None = None  # what the backend says it built (vfuse: kernels, fallbacks)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ContenderResult:
        check, stats = data.get("check"), data.get("time")
        return ContenderResult(
            **{
                **data,
                "check": Check.from_dict(check) if check else None,
                "time": Stats.from_dict(stats) if stats else None,
            }
        )


@dataclass(frozen=True)
class CopyResult:
    traffic_bytes: int
    prealloc: Stats
    fresh: Stats
    prealloc_gbps: float
    fresh_gbps: float

    @staticmethod
    def from_dict(data: dict[str, Any]) -> CopyResult:
        return CopyResult(
            int(data["traffic_bytes"]),
            Stats.from_dict(data["prealloc"]),
            Stats.from_dict(data["fresh"]),
            float(data["prealloc_gbps"]),
            float(data["fresh_gbps"]),
        )


@dataclass(frozen=True)
class WorkloadResult:
    name: str
    description: str
    input_shapes: tuple[str, ...]
    minimal_bytes: int
    copy: CopyResult
    contenders: tuple[ContenderResult, ...]
    frozen: bool = False  # compiling contenders got parameters as constants (Workload.frozen)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> WorkloadResult:
        return WorkloadResult(
            name=data["name"],
            description=data["description"],
            input_shapes=tuple(data["input_shapes"]),
            minimal_bytes=int(data["minimal_bytes"]),
            copy=CopyResult.from_dict(data["copy"]),
            contenders=tuple(ContenderResult.from_dict(c) for c in data["contenders"]),
            frozen=bool(data.get("frozen", False)),
        )


@dataclass(frozen=True)
class RunResult:
    """One pass over the workloads in one process (the default run, or the no-mmap child)."""

    label: str
    machine: MachineInfo
    workloads: tuple[WorkloadResult, ...]

    @property
    def ok(self) -> bool:
        return all(c.status == "ok" for w in self.workloads for c in w.contenders)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RunResult:
        return RunResult(
            label=data["label"],
            machine=MachineInfo.from_dict(data["machine"]),
            workloads=tuple(WorkloadResult.from_dict(w) for w in data["workloads"]),
        )


@dataclass(frozen=True)
class CompileTime:
    """Compile time of one contender on one workload, measured in fresh processes.

    Three probes (see `compile_times`): cold (empty caches), warm (a new process on the caches
    the cold one filled) and warm_process (warm caches, and the process compiled another
    function with the same backend first). For each: the first call's time (compile + one
    call), the time inside the backend alone (None for a contender without one), and the
    garbage collector's pauses inside that first call.
    """

    contender: str
    workload: str
    cold_first_call_s: float | None  # empty cache dirs: full compile + one call
    warm_first_call_s: float | None  # same cache dirs, new process: cache hits + one call
    steady_call_s: float | None  # one call once compiled, to subtract from the above
    error: str | None
    warm_process_first_call_s: float | None = None  # warm caches, a 2nd graph of the process
    cold_backend_s: float | None = None  # FX graph in, callable out (AOTAutograd included)
    warm_backend_s: float | None = None
    warm_process_backend_s: float | None = None
    cold_gc_s: float | None = None  # garbage-collector pauses inside the first call
    warm_gc_s: float | None = None
    warm_process_gc_s: float | None = None

    @staticmethod
    def from_probes(
        contender: str, workload: str, cold: dict[str, Any], warm: dict[str, Any], warm_process: dict[str, Any]
    ) -> CompileTime:
        """From the three children's JSON lines (first_call_s, backend_s, gc_s, steady_call_s)."""
        return CompileTime(
            contender,
            workload,
            cold["first_call_s"],
            warm["first_call_s"],
            min(p["steady_call_s"] for p in (cold, warm, warm_process)),
            None,
            warm_process["first_call_s"],
            cold.get("backend_s"),
            warm.get("backend_s"),
            warm_process.get("backend_s"),
            cold.get("gc_s"),
            warm.get("gc_s"),
            warm_process.get("gc_s"),
        )

    @property
    def cold_compile_s(self) -> float | None:
        return _minus(self.cold_first_call_s, self.steady_call_s)

    @property
    def warm_compile_s(self) -> float | None:
        return _minus(self.warm_first_call_s, self.steady_call_s)

    @property
    def warm_process_compile_s(self) -> float | None:
        return _minus(self.warm_process_first_call_s, self.steady_call_s)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, a - b)


@dataclass(frozen=True)
class BenchReport:
    schema: str
    config: dict[str, Any]
    runs: tuple[RunResult, ...]
    compile_times: tuple[CompileTime, ...] | None
    ok: bool
    errors: tuple[str, ...] = ()  # a whole phase that failed (e.g. the --no-mmap child)

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.compile_times is not None:
            # Properties are not fields; write the derived compile times out for JSON readers.
            for row, ct in zip(data["compile_times"], self.compile_times, strict=True):
                row["cold_compile_s"], row["warm_compile_s"] = ct.cold_compile_s, ct.warm_compile_s
                row["warm_process_compile_s"] = ct.warm_process_compile_s
        for run_data, run in zip(data["runs"], self.runs, strict=True):
            run_data["ok"] = run.ok
        return data
