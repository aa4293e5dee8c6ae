"""Calibration of the cpu target against vfuse's own generated kernels, per instruction-set tier.

`targets/cpu.py` measures the machine with torch (a `copy_`, a matmul, an add): what torch's kernels
reach, not what vfuse's do. A calibration (made by `vfuse calibrate`, `entry/calibrate.py`, which
needs the compiler) times vfuse's kernels on one thread, where a loaded machine disturbs them least:
the streaming add at a working set in L2, in L3 and in DRAM, a chain of transcendental ops, the GEMM
template, and a kernel too small to fork threads. This module holds the result, its cache (one entry
per tier, keyed by the CPU fingerprint: `calibration_cpu.json` next to `target_cpu.json`), the
plausibility guard, and how a Target is derived from it (`apply`) or for fewer threads (`at_threads`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from vfuse.cachedir import write_json_atomic
from vfuse.errors import VfuseOptionError
from vfuse.targets.target import DRAM_BW_PER_CORE, Target

CALIBRATION_VERSION = 7  # 7: library_f32 is torch's own fitted rate, with its own overheads
CALIBRATION_FILE = "calibration_cpu.json"
# Whether a cached calibration is applied where the caller does not say: "on" (default) or "off", the
# torch-measured target alone (the test suite pins it: a developer's calibration changes plans).
ENV_VAR = "VFUSE_CALIBRATION"
_SETTINGS = {"on": True, "1": True, "true": True, "auto": True, "off": False, "0": False, "false": False}


def wanted(calibrated: bool | None = None) -> bool:
    """Whether the cpu target applies a cached calibration: `calibrated` when given, else VFUSE_CALIBRATION
    (unset: on); a value it does not know raises VfuseOptionError naming the variable."""
    if calibrated is not None:
        return calibrated
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if not value:
        return True
    if value not in _SETTINGS:
        raise VfuseOptionError(f"{ENV_VAR}={value!r} is not accepted; accepted: 'on' (default) or 'off'")
    return _SETTINGS[value]


@dataclass(frozen=True, slots=True)
class Calibration:
    """Per-thread rates of vfuse's kernels at one tier (bytes/s, flop/s, seconds).

    l1_bw / l2_bw / l3_bw / dram_bw: the streaming add (read 2, write 1) with its data in L1, L2,
    L3, DRAM. vector_f32: IR flops (the cost model's count) per second of a chain of cheap ops
    (add, mul, abs, max) in L2; transcendental_f32: the same for exp, tanh, sigmoid, GELU, SiLU;
    op_rates: each of them (and log) alone: the IR's flop weights are instruction estimates, off by
    up to 3x against each other.
    peak_f32: the GEMM template's flop/s; library_f32: torch's library GEMM's (0: not measured), each
    net of its own overheads, whose ratio decides template or library (`fusion/library.py`);
    attention_f32 / library_attention_f32: the same pair for the attention template and torch's SDPA.
    serial_launch_s: a kernel too small to fork threads.
    contraction_elem_s / contraction_call_s: the GEMM template's time past its flops at peak_f32, per
    element of A, B and C (packing, storing the tile) and per call, fitted with peak_f32 over GEMMs
    from 16 x 16 x 16 to the peak's shape (0: not measured); library_elem_s / library_call_s: torch.mm's,
    fitted with library_f32 to its times over the same shapes.
    launch_s: a threaded kernel's fork/join on all cores (0: not measured or implausible).
    """

    l1_bw: float
    l2_bw: float
    l3_bw: float
    dram_bw: float
    vector_f32: float
    transcendental_f32: float
    peak_f32: float
    serial_launch_s: float
    launch_s: float = 0.0
    op_rates: tuple[tuple[str, float], ...] = ()  # (op name, IR flop/s) of each transcendental op alone
    chain_weight: float = 0.0  # extra time per transcendental op past the first in one kernel
    attention_task_s: float = 0.0  # fixed cost of one (batch, head) task of the attention template
    library_f32: float = 0.0  # torch's GEMM flop/s at peak_f32's shape (0: not measured)
    contraction_elem_s: float = 0.0  # seconds per A, B, C element of a GEMM past its flops
    contraction_call_s: float = 0.0  # seconds per GEMM call past its flops and elements
    library_elem_s: float = 0.0  # torch.mm's seconds per A, B, C element past its flops
    library_call_s: float = 0.0  # torch.mm's seconds per call past its flops and elements
    attention_f32: float = 0.0  # the attention template's flop/s past its tasks (0: not measured)
    strided_run_s: float = 0.0  # one row run of a column walk past the LLC (0: not measured)
    library_attention_f32: float = 0.0  # torch's SDPA flop/s past its tasks (0: not measured)


# Fixed costs a calibration may set, and their plausible maxima (a GEMM element past 10 ns is a
# preempted timing, not a packing cost).
FIXED_COSTS = {"attention_task_s": 5e-5, "contraction_elem_s": 1e-8, "contraction_call_s": 5e-5}
FIXED_COSTS |= {"library_elem_s": 1e-8, "library_call_s": 5e-5, "strided_run_s": 2e-7}


# Figures a calibration may leave at 0 (not measured): the cost model then uses its defaults.
OPTIONAL = frozenset({"launch_s", "library_f32", "attention_f32", "library_attention_f32"})


def guarded(cal: Calibration, target: Target, library_lanes: int = 0) -> tuple[Calibration, list[str]]:
    """`cal` with each value outside its plausible range replaced by `target`'s per-thread figure
    (launch_s: by 0, keep the target's), and the names of those replaced. The ranges are wide and
    absolute: on a loaded machine the torch-measured target itself can be off by 10x.
    `library_lanes`: the vector width torch's library GEMM runs at (the CPU's own, whatever tier
    `target` is: torch.mm at 4.4x the forced AVX2 tier's vector rate on an AVX-512 Xeon; 0: the target's)."""
    n = max(target.cores, 1)
    vector = target.vector_f32 / n  # half the theoretical FMA rate of one core (targets/cpu.py)
    library = vector * max(library_lanes, target.simd_lanes) / target.simd_lanes
    ranges = {
        "l1_bw": (1e9, 4e12, target.cache_bw / n),
        "l2_bw": (1e9, 2e12, target.cache_bw / n),
        "l3_bw": (1e9, 2e12, target.cache_bw / n),
        "dram_bw": (5e8, DRAM_BW_PER_CORE[1], target.dram_bw / n),  # one thread's copy
        "vector_f32": (0.01 * vector, 2.0 * vector, vector),
        "transcendental_f32": (0.005 * vector, 2.0 * vector, vector),
        "peak_f32": (0.05 * vector, 3.0 * vector, target.peak_f32 / n),
        "serial_launch_s": (5e-9, 2e-5, target.launch_s / 4),
        "launch_s": (5e-8, 5e-5, 0.0),
        "library_f32": (0.05 * library, 3.0 * library, 0.0),  # 0: unknown, the cost model's default ratio
        "attention_f32": (0.05 * vector, 3.0 * vector, 0.0),  # 0: unknown, at peak_f32
        "library_attention_f32": (0.05 * library, 3.0 * library, 0.0),  # 0: unknown, the default ratio
    }
    bad, values = [], {}
    for f in fields(cal):
        if f.name in ("op_rates", "chain_weight", *FIXED_COSTS):
            continue
        lo, hi, fallback = ranges[f.name]
        got = getattr(cal, f.name)
        ok = lo <= got <= hi or (f.name in OPTIONAL and got == 0)
        values[f.name] = got if ok else fallback
        if not ok:
            bad.append(f.name)
    values["chain_weight"] = cal.chain_weight if 0 <= cal.chain_weight <= 2 else 0.0
    bad += [] if 0 <= cal.chain_weight <= 2 else ["chain_weight"]
    for name, hi in FIXED_COSTS.items():  # 0 (unknown) where implausible
        got = getattr(cal, name)
        values[name] = got if 0 <= got <= hi else 0.0
        bad += [] if 0 <= got <= hi else [name]
    lo, hi, _ = ranges["transcendental_f32"]
    values["op_rates"] = tuple((op, r) for op, r in cal.op_rates if lo <= r <= hi)
    bad += [f"op_rates.{op}" for op, r in cal.op_rates if not lo <= r <= hi]
    return Calibration(**values), bad


def apply(target: Target, cal: Calibration) -> Target:
    """`target` (all its cores) with the calibrated rates: per-thread rates times the cores; DRAM
    bandwidth at least what one thread reached (a loaded machine only lowers the copy_ figure)."""
    n = target.cores
    f32 = cal.peak_f32 * n
    r = f32 / target.peak_f32  # bf16/f16/i8 peaks keep their ratios to fp32 (the tier's extensions)
    return replace(
        target,
        l1_bw=cal.l1_bw * n,
        l2_bw=cal.l2_bw * n,
        cache_bw=cal.l3_bw * n,
        dram_bw=max(target.dram_bw, cal.dram_bw),
        dram_bw_thread=cal.dram_bw,
        vector_f32=cal.vector_f32 * n,
        transcendental_f32=cal.transcendental_f32 * n,
        op_rates=tuple((op, r * n) for op, r in cal.op_rates),
        chain_weight=cal.chain_weight,
        attention_task_s=cal.attention_task_s,
        attention_f32=cal.attention_f32 * n,
        library_attention_f32=cal.library_attention_f32 * n,
        strided_run_s=cal.strided_run_s,
        peak_f32=f32,
        library_f32=cal.library_f32 * n,
        contraction_elem_s=cal.contraction_elem_s,
        contraction_call_s=cal.contraction_call_s,
        library_elem_s=cal.library_elem_s,
        library_call_s=cal.library_call_s,
        serial_launch_s=cal.serial_launch_s,
        launch_s=cal.launch_s or target.launch_s,
        source=target.source + " (calibrated on vfuse kernels)",
        peak_f16=target.peak_f16 * r,
        peak_bf16=target.peak_bf16 * r,
        peak_i8=target.peak_i8 * r,
    )


def at_threads(target: Target, threads: int) -> Target:
    """`target` as `threads` of its cores see it (profiling at 1 thread on a loaded machine): rates
    that scale with cores scaled, DRAM bandwidth at most `threads` times one thread's."""
    if threads == target.cores or target.is_gpu:
        return target
    s = threads / target.cores
    dram = min(target.dram_bw, threads * target.dram_bw_thread) if target.dram_bw_thread else target.dram_bw * s
    one = threads == 1 and target.serial_launch_s > 0  # one thread forks nobody
    return replace(
        target,
        cores=threads,
        max_threads=threads,
        vector_f32=target.vector_f32 * s,
        peak_f32=target.peak_f32 * s,
        library_f32=target.library_f32 * s,
        attention_f32=target.attention_f32 * s,
        library_attention_f32=target.library_attention_f32 * s,
        peak_f16=target.peak_f16 * s,
        peak_bf16=target.peak_bf16 * s,
        peak_i8=target.peak_i8 * s,
        l1_bw=target.l1_bw * s,
        l2_bw=target.l2_bw * s,
        transcendental_f32=target.transcendental_f32 * s,
        op_rates=tuple((op, r * s) for op, r in target.op_rates),
        cache_bw=target.cache_bw * s,
        dram_bw=dram,
        launch_s=target.serial_launch_s if one else target.launch_s,
    )


def read(cache_dir: Path, fingerprint: str, tier: str) -> Calibration | None:
    """The cached calibration of `tier` on this CPU, or None (missing, corrupt, another CPU)."""
    try:
        data = json.loads((cache_dir / CALIBRATION_FILE).read_text())
        if data.get("version") != CALIBRATION_VERSION or data.get("fingerprint") != fingerprint:
            return None
        d = dict(data["tiers"][tier])
        d["op_rates"] = tuple((str(op), float(r)) for op, r in d.get("op_rates", ()))
        return Calibration(**d)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _tiers(path: Path, fingerprint: str) -> dict[str, object]:
    try:
        old = json.loads(path.read_text())
        if old.get("version") == CALIBRATION_VERSION and old.get("fingerprint") == fingerprint:
            return dict(old["tiers"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return {}


def write(cache_dir: Path, fingerprint: str, tier: str, cal: Calibration | None) -> Path:
    """Add `tier`'s calibration to the cache (atomic replace; other tiers kept); None drops it (a new
    calibration times kernels planned without the old one: with its library rate, the GEMMs it
    times could be sent to torch)."""
    path = cache_dir / CALIBRATION_FILE
    tiers = _tiers(path, fingerprint)
    if cal is None and tier not in tiers:
        return path
    if cal is None:
        del tiers[tier]
    else:
        tiers[tier] = asdict(cal)
    payload = {"version": CALIBRATION_VERSION, "fingerprint": fingerprint, "tiers": tiers}
    write_json_atomic(path, payload)
    return path
