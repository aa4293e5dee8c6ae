"""The `cpu` target: read the machine's description, measure it briefly, cache the result.

Static facts come from the OS (affinity mask, /proc/cpuinfo flags and clock, /sys cache sizes);
bandwidths, fp32 matmul throughput and the per-kernel fixed cost are measured once (well under a
second) and cached as JSON, keyed by a fingerprint of the static facts so that a cache copied to
another machine is not trusted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from vfuse.cachedir import dir_problem, make_private_dir, write_json_atomic
from vfuse.errors import VfuseOptionError
from vfuse.targets import calibrate
from vfuse.targets.isa import LANES, VECTOR_REGS, CpuIsa, Isa, IsaExtra, detect_isa, machine_arch, resolve_isa
from vfuse.targets.target import DRAM_BW_PER_CORE, Target

CACHE_VERSION = 1
FMA_PIPES = 2  # vector FMA pipes per core on current x86 server cores (Zen4/5, Sapphire Rapids)
# How far above the theoretical rate at /proc/cpuinfo's clock a measured GEMM may run: a VM reports
# its base clock (the Xeon VM of sessions 24-27: 2.6 GHz, torch.mm at 429 G flop/s on 2 vCPUs, 1.29x
# that clock's 333); turbo clocks reach about twice a server part's base. Past 1.2x the measurement
# was taken as implausible and the peak estimated at half the clock's: 2.6x too slow on that VM.
TURBO = 2.0
# The most last-level cache a core is counted (`llc_share`): more than any CPU's own share per core,
# the 3D V-Cache parts' 12 MiB (96 MiB over 8 cores) included.
L3_PER_CORE = 16 << 20


@dataclass(frozen=True, slots=True)
class CpuFacts:
    """What the OS says about the CPU, before any measurement."""

    model: str
    cores: int
    flags: frozenset[str]
    ghz: float
    l1d: int
    l2: int
    l3: int
    arch: str = field(default_factory=machine_arch)

    @property
    def isa(self) -> CpuIsa:
        """The CPU's own instruction-set tier (what it is measured at)."""
        return detect_isa(self.flags, self.arch)

    @property
    def simd_lanes(self) -> int:
        return LANES[self.isa.tier]

    @property
    def vector_regs(self) -> int:
        return VECTOR_REGS[self.isa.tier]

    def fingerprint(self) -> str:
        return f"{self.model}|{self.cores}|{self.simd_lanes}|{self.l1d}|{self.l2}|{self.l3}"


def _first_cpu() -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo ({} without it). Reads only that block:
    the kernel generates the file as it is read, one block per CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            return first_block(f)
    except OSError:
        return {}


def first_block(lines: Iterable[str]) -> dict[str, str]:
    """The `key: value` fields of the first block of a /proc/cpuinfo text (x86: one per CPU;
    aarch64: one per CPU, with `Features` for the flags)."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpuinfo() -> tuple[str, frozenset[str], float]:
    cpu = _first_cpu()
    try:
        mhz = float(cpu.get("cpu MHz", "2500"))
    except ValueError:
        mhz = 2500.0
    return cpu.get("model name", "unknown"), flags_of(cpu), mhz / 1000


def flags_of(cpu: dict[str, str]) -> frozenset[str]:
    """The ISA flags of one /proc/cpuinfo block: `flags` on x86, `Features` on Arm."""
    return frozenset((cpu.get("flags") or cpu.get("Features") or "").split())


@functools.cache
def machine_flags() -> frozenset[str]:
    """This CPU's ISA flags, read once per process."""
    return flags_of(_first_cpu())


def machine_isa() -> CpuIsa:
    """This CPU's own tier, whatever VFUSE_ISA says."""
    return detect_isa(machine_flags(), machine_arch())


def isa_for(requested: Isa | None) -> CpuIsa:
    """The tier code is compiled for on this CPU: its own (None) or a lower one it was asked for;
    a tier the CPU lacks raises VfuseOptionError naming the missing flags."""
    return resolve_isa(requested, machine_flags(), machine_arch())


# The /proc/cpuinfo fields that tell what code -march=native emits (x86: model and ISA flags; Arm:
# implementer, part and features; RISC-V: isa); clock, core ids and bogomips vary and are left out.
ISA_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags", "CPU implementer", "CPU architecture")
ISA_FIELDS += ("CPU variant", "CPU part", "Features", "isa", "uarch")


def isa_of(cpu: dict[str, str]) -> str:
    """The instruction-set fingerprint of one /proc/cpuinfo block (see isa_fingerprint)."""
    parts = [f"{k}={cpu[k]}" for k in ISA_FIELDS if k in cpu] or [platform.processor()]  # no /proc: a weak guess
    return "|".join([platform.machine(), *parts])


@functools.cache
def isa_fingerprint() -> str:
    """This machine's CPU model and instruction-set flags, for keys of code compiled for it:
    a library built with -march=native for another CPU can die of SIGILL here. Read once per process."""
    return isa_of(_first_cpu())


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _caches() -> dict[int, int]:
    """Data/unified cache size per level of cpu0 (defaults when /sys is unavailable)."""
    sizes = {1: 32 * 1024, 2: 1024 * 1024, 3: 16 * 1024 * 1024}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            sizes[int((index / "level").read_text())] = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
    return sizes


def detect() -> CpuFacts:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    model, flags, ghz = _cpuinfo()
    c = _caches()
    return CpuFacts(model, cores, flags, ghz, c[1], c[2], llc_share(c.get(3, 0), cores))


def llc_share(l3: int, cores: int) -> int:
    """The last-level cache our cores can count on: what the OS reports, at most L3_PER_CORE per
    core. A VM or container with a few cores of a large socket sees the socket's whole L3, shared
    with every other core's work (a 2-vCPU Xeon VM reports 480 MiB: planned on it, transpose_add
    stored its output through the cache and ran at 33 % of copy, with 32 MiB 62 %; chain and
    gelu_residual +10 %; docs/perf-log.md, session 24)."""
    return min(l3, max(cores, 1) * L3_PER_CORE) if l3 else l3


def _best_time(fn: Callable[[], object], reps: int, budget_s: float = 0.08) -> float:
    """Best of `reps` runs, stopping early after `budget_s` so that a loaded machine cannot make
    the whole measurement take more than a fraction of a second."""
    fn()  # warm up: first-touch page faults and lazy init are not what we measure
    best = float("inf")
    t_end = time.perf_counter() + budget_s
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        best = min(best, t1 - t0)
        if t1 > t_end:
            break
    return best


def _copy_bw(nbytes: int, reps: int) -> float:
    """Bytes/s of a multi-threaded copy (read + write counted once each)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_time(lambda: dst.copy_(src), reps)


def _matmul_flops(n: int = 384, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b), reps)


def _kernel_overhead(cache_bw: float) -> float:
    """Fixed cost of one parallel kernel: a 64K-element add runs on all threads (above torch's
    32K-element grain) from cache, so its time minus its data time approximates fork/join plus
    dispatch; a 2-element add (dispatch only) is the floor."""
    n = 65536
    x, y, z = torch.ones(n), torch.ones(n), torch.empty(n)
    t_par = _best_time(lambda: torch.add(x, y, out=z), 50)
    s = torch.ones(2)
    t_tiny = _best_time(lambda: torch.add(s, s, out=s), 50)
    return max(t_tiny, t_par - 3 * 4 * n / cache_bw)


def theoretical_f32(facts: CpuFacts) -> float:
    """fp32 flop/s if every FMA pipe of every core issued one FMA (2 flops) each cycle."""
    return facts.cores * facts.ghz * 1e9 * facts.simd_lanes * FMA_PIPES * 2


def _plausible(value: float, lo: float, hi: float, fallback: float, bad: list[str], what: str) -> float:
    """The measurement when in [lo, hi], else the fallback. On a loaded machine (another process
    on our cores) a measurement can be off by 1000x; planning on it would be worse than a guess."""
    if lo <= value <= hi:
        return value
    bad.append(what)
    return fallback


def dram_bounds(cores: int) -> tuple[float, float]:
    """Plausible [lo, hi] for a whole-machine DRAM copy on `cores` cores (few cores saturate DRAM)."""
    lo, hi = DRAM_BW_PER_CORE
    return lo * min(max(cores, 1), 4), min(hi * max(cores, 1), 2e12)


def measure(facts: CpuFacts) -> tuple[Target, list[str]]:
    """The cpu Target from static facts plus ~0.1 s of measurements, and the names of the
    measurements that were implausible and replaced by estimates."""
    bad: list[str] = []
    peak = theoretical_f32(facts)
    dram_bw = _plausible(_copy_bw(64 * 1024 * 1024, 3), *dram_bounds(facts.cores), 10e9 * facts.cores, bad, "dram_bw")
    cache_bw = max(dram_bw, _copy_bw(min(facts.l3 // 4 or 1 << 20, 4 << 20), 10))
    f32 = _plausible(_matmul_flops(), 0.1 * peak, TURBO * peak, 0.5 * peak, bad, "peak_f32")
    launch = _plausible(_kernel_overhead(cache_bw), 1e-7, 5e-5, 2e-6, bad, "launch_s")
    isa = facts.isa
    source = f"measured on {facts.model}" + (f" (estimated: {', '.join(bad)})" if bad else "")
    target = Target(
        name="cpu",
        kind="cpu",
        cores=facts.cores,
        simd_lanes=facts.simd_lanes,
        l1_bytes=facts.l1d,
        l2_bytes=facts.l2,
        l3_bytes=facts.l3,
        smem_per_sm=0,
        regs_per_thread=facts.vector_regs,
        regs_per_sm=facts.vector_regs,
        dram_bw=dram_bw,
        cache_bw=cache_bw,
        peak_f32=f32,
        # Pointwise IR flops are instruction counts: no FMA pairing, FMA_PIPES vector ops/cycle.
        vector_f32=peak / 2,
        launch_s=launch,
        max_threads=facts.cores,
        source=source,
        isa=isa.tier,
        isa_extras=isa.extras,
        **matrix_peaks(f32, isa.extras),
    )
    return target, bad


def matrix_peaks(f32: float, extras: frozenset[IsaExtra]) -> dict[str, float]:
    """peak_f16/bf16/i8 as ratios to fp32 FMA throughput, from the tier's extensions."""
    return {
        "peak_bf16": f32 * (2 if IsaExtra.BF16 in extras or IsaExtra.AMX in extras else 1),
        "peak_f16": f32 * (2 if IsaExtra.FP16 in extras else 1),
        "peak_i8": f32 * (4 if IsaExtra.VNNI in extras else 2),
    }


def at_tier(target: Target, isa: CpuIsa) -> Target:
    """`target`, measured at the CPU's own tier, as code compiled for `isa` sees it: its vector
    width and registers, and vector and matrix peaks scaled by the ratio of vector widths."""
    if target.isa is isa.tier and target.isa_extras == isa.extras:
        return target
    scale = LANES[isa.tier] / target.simd_lanes
    f32 = target.peak_f32 * scale
    return replace(
        target,
        library_gain=target.library_gain / scale,  # torch keeps the CPU's own width
        isa=isa.tier,
        isa_extras=isa.extras,
        simd_lanes=LANES[isa.tier],
        regs_per_thread=VECTOR_REGS[isa.tier],
        regs_per_sm=VECTOR_REGS[isa.tier],
        peak_f32=f32,
        vector_f32=target.vector_f32 * scale,
        **matrix_peaks(f32, isa.extras),
    )


# A measurement with implausible values (replaced by estimates) is cached too, and measured
# again on the first lookup after this long. Not caching it meant measuring again (~0.4 s) in
# every compile for as long as the machine stayed busy; on a 2-core machine shared with other
# jobs, every 2-thread measurement can be implausible (an OpenMP barrier waits a time slice).
ESTIMATE_TTL_S = 3600.0
# Plausible figures measured while other work held the cores (`_busy`) are measured again sooner: an
# hour of a DRAM bandwidth measured at a third of the quiet figure (8.4 vs 25 GB/s, a bench started as
# another finished) planned forced-AVX2 hf_bert at 0.94x eager (1.07x with the quiet figure).
BUSY_TTL_S = 600.0


# Target fields only a calibration sets (`targets/calibrate.apply`): never in the measured cache, so a
# cache written before they existed stays valid and earlier versions still read the caches written now.
CALIBRATED_ONLY = frozenset(
    {
        "library_f32",
        "contraction_elem_s",
        "contraction_call_s",
        "library_elem_s",
        "library_call_s",
        "attention_f32",
        "library_attention_f32",
        "strided_run_s",
    }
)
# Fields `at_tier` derives from the CPU's own tier on every read: never cached either.
NOT_CACHED = CALIBRATED_ONLY | {"library_gain"}


def _read_cache(path: Path, facts: CpuFacts) -> tuple[Target, float] | None:
    """(the cached Target, when to measure again: inf for a plausible measurement), or None
    when missing, corrupt, stale, or from another machine."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION or data.get("fingerprint") != facts.fingerprint():
            return None
        names = {f.name for f in fields(Target)} - NOT_CACHED
        if set(data["target"]) != names:
            return None
        target = _from_json(data["target"])
        lo, hi = dram_bounds(target.cores)
        if not lo <= target.dram_bw <= hi:  # kept by a version without the bounds: measured again
            return None
        return target, float(data.get("remeasure_after", math.inf))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _write_cache(path: Path, facts: CpuFacts, target: Target, estimated: list[str]) -> None:
    """Atomic write (temp file + os.replace): readers never see half a file."""
    make_private_dir(path.parent)
    payload: dict[str, object] = {"version": CACHE_VERSION, "fingerprint": facts.fingerprint()}
    if estimated:
        busy = all(e.startswith(f"{BUSY_FLAG} ") for e in estimated)
        payload |= {"estimated": estimated, "remeasure_after": time.time() + (BUSY_TTL_S if busy else ESTIMATE_TTL_S)}
    payload["target"] = _to_json(target)
    write_json_atomic(path, payload)


def _to_json(target: Target) -> dict[str, Any]:
    data = {k: v for k, v in asdict(target).items() if k not in NOT_CACHED}
    data["isa"] = target.isa.value if target.isa else None
    data["isa_extras"] = sorted(e.value for e in target.isa_extras)
    return data


def _from_json(data: dict[str, Any]) -> Target:
    isa = Isa(data["isa"]) if data["isa"] else None
    extras = frozenset(IsaExtra(e) for e in data["isa_extras"])
    rates = tuple((str(op), float(r)) for op, r in data.get("op_rates", ()))  # JSON has lists, Target tuples
    return Target(**{**data, "isa": isa, "isa_extras": extras, "op_rates": rates})


def cpu_target(
    cache_dir: Path, remeasure: bool = False, isa: Isa | None = None, calibrated: bool | None = None
) -> Target:
    """This machine at its own tier, or at the lower tier `isa` (VfuseOptionError when it lacks it).
    The cache holds the measurement at the CPU's own tier; a forced tier is applied to it.
    `calibrated`: apply the tier's cached calibration (None: VFUSE_CALIBRATION, default on)."""
    use = calibrate.wanted(calibrated)  # a bad VFUSE_CALIBRATION is refused before anything is measured
    facts = detect()
    target = measured_target(cache_dir, remeasure, isa, facts)
    if not use or target.isa is None or not _trusted(cache_dir):
        return target
    # vfuse's own kernels at this tier, when `vfuse calibrate` has timed them (targets/calibrate.py).
    cal = calibrate.read(cache_dir, facts.fingerprint(), target.isa.value)
    return calibrate.apply(target, cal) if cal is not None else target


def measured_target(
    cache_dir: Path, remeasure: bool = False, isa: Isa | None = None, facts: CpuFacts | None = None
) -> Target:
    """The torch-measured target at tier `isa`, without a calibration applied."""
    facts = facts or detect()
    tier = resolve_isa(isa, facts.flags, facts.arch)  # before measuring: an impossible tier fails at once
    target = at_tier(_machine_target(cache_dir, facts, remeasure), tier)
    return replace(target, library_gain=1.0) if library_width() == "tier" else target


# The width torch's libraries are planned at on a forced lower tier: "cpu" (default), the CPU's own,
# where they run; "tier", the tier's, as on a machine of that tier. The test suite pins "tier": forced-
# tier runs then plan, and so test, the templates that tier's machines get.
LIBRARY_WIDTH_VAR = "VFUSE_LIBRARY_WIDTH"


@contextlib.contextmanager
def templates_planned() -> Iterator[None]:
    """Inside, a forced tier plans torch at the tier's width: a calibration times the templates
    themselves, which at the CPU's width would go to torch (VFUSE_LIBRARY_WIDTH=tier, then restored)."""
    before = os.environ.get(LIBRARY_WIDTH_VAR)
    os.environ[LIBRARY_WIDTH_VAR] = "tier"
    try:
        yield
    finally:
        if before is None:
            del os.environ[LIBRARY_WIDTH_VAR]
        else:
            os.environ[LIBRARY_WIDTH_VAR] = before


def library_width() -> str:
    """VFUSE_LIBRARY_WIDTH's setting ("cpu" when unset); another value raises VfuseOptionError."""
    value = os.environ.get(LIBRARY_WIDTH_VAR, "").strip().lower() or "cpu"
    if value not in ("cpu", "tier"):
        raise VfuseOptionError(f"{LIBRARY_WIDTH_VAR}={value!r} is not accepted; accepted: 'cpu' (default) or 'tier'")
    return value


def _machine_target(cache_dir: Path, facts: CpuFacts, remeasure: bool) -> Target:
    path = cache_dir / "target_cpu.json"
    trusted = _trusted(cache_dir)
    cached = None if remeasure or not trusted else _read_cache(path, facts)
    if cached is not None and time.time() < cached[1]:
        return cached[0]
    target, bad = measure(facts)
    bad = [*bad, *_busy(facts.cores)]
    try:
        if trusted:
            _write_cache(path, facts, target, bad)
    except OSError:
        pass  # a read-only cache dir costs a re-measurement next time, nothing more
    return target


def _busy(cores: int) -> list[str]:
    """["load X"] when other work held more than half the cores as this was measured: the figures
    (kept) are then re-measured after BUSY_TTL_S. Measured under a test run's load, a Xeon's DRAM
    bandwidth was cached at 5.7 GB/s (25 quiet) and changed a plan's form."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return []
    return [f"{BUSY_FLAG} {load:.1f}"] if load > cores / 2 else []


BUSY_FLAG = "load"


def _trusted(cache_dir: Path) -> bool:
    """Whether `cache_dir` (created 0700 when missing) is this user's alone; the kernel cache
    warns about one that is not, this only stops reading and writing measurements there."""
    try:
        make_private_dir(cache_dir)
    except OSError:
        return False
    return dir_problem(cache_dir) is None
