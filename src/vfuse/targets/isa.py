"""Instruction-set tiers: which vector instructions generated code may use on this CPU.

A tier is what the kernels are compiled for (`-march`), not everything the CPU has: `VFUSE_ISA` (or
the `isa` option) forces a lower one, so the AVX2 code is built and tested on an AVX-512 machine
too. Forcing a tier the CPU lacks is refused with the missing /proc/cpuinfo flags named, because
code built for it would die of SIGILL.
"""

from __future__ import annotations

import enum
import os
import platform
from dataclasses import dataclass

from vfuse.errors import VfuseOptionError


class Isa(enum.Enum):
    GENERIC = "generic"  # x86-64 baseline (SSE2) or armv8-a: no hand-written vector code
    AVX2 = "avx2"  # x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE
    AVX512 = "avx512"  # x86-64-v4: AVX512F/BW/CD/DQ/VL
    NEON = "neon"  # aarch64 Advanced SIMD


class IsaExtra(enum.Enum):
    """Optional extensions of a tier, recorded for kernels and the cost model to use where present."""

    VBMI = "vbmi"
    VNNI = "vnni"
    BF16 = "bf16"
    FP16 = "fp16"
    AMX = "amx"
    DOTPROD = "dotprod"


X86, ARM = "x86_64", "aarch64"
ARCH = {Isa.GENERIC: None, Isa.AVX2: X86, Isa.AVX512: X86, Isa.NEON: ARM}
# The /proc/cpuinfo flags each tier needs (the psABI's x86-64-v2 and -v3 lists for AVX2: g++'s
# -march=x86-64-v3 may emit any of them; OSXSAVE is not listed by Linux, XSAVE stands for it).
_V3 = ("cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2")
_V3 += ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
REQUIRED: dict[Isa, tuple[str, ...]] = {
    Isa.GENERIC: (),
    Isa.AVX2: _V3,
    Isa.AVX512: (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    Isa.NEON: ("asimd",),
}
# Extension -> the flags that must all be present, per tier.
EXTRAS: dict[Isa, dict[IsaExtra, tuple[str, ...]]] = {
    Isa.AVX512: {
        IsaExtra.VBMI: ("avx512vbmi",),
        IsaExtra.VNNI: ("avx512_vnni",),
        IsaExtra.BF16: ("avx512_bf16",),
        IsaExtra.FP16: ("avx512_fp16",),
        IsaExtra.AMX: ("amx_tile", "amx_bf16", "amx_int8"),
    },
    Isa.NEON: {IsaExtra.DOTPROD: ("asimddp",), IsaExtra.FP16: ("fphp", "asimdhp"), IsaExtra.BF16: ("bf16",)},
}
LANES = {Isa.GENERIC: 4, Isa.AVX2: 8, Isa.AVX512: 16, Isa.NEON: 4}  # fp32 lanes the schedule plans for
VECTOR_REGS = {Isa.GENERIC: 16, Isa.AVX2: 16, Isa.AVX512: 32, Isa.NEON: 32}
# Explicit tiers compile for the tier's baseline (tuned for this CPU), so that a forced tier builds
# the code a machine of that tier gets; a tier that is the top one of its architecture uses native.
# g++ 12 at plain x86-64 moved 2-float vectors through MMX registers without `emms`, leaving the x87
# stack full: the next x87 operation in the process (torch's floor_divide) returned NaN. No MMX.
# AVX-512 code is planned for 16 lanes, but g++'s tunings of Intel server and client cores (icelake,
# rocketlake, sapphirerapids) prefer 256-bit vectors: loops and the element loops of 16-lane values
# came out 8-wide or scalar (LayerNorm 8192 x 256 at 2.7x the AVX2 build's time on a Xeon that g++
# takes for a Rocket Lake: docs/perf-log.md, session 24). The width is the plan's, not the tuning's.
MARCH = {
    (Isa.GENERIC, X86): ("-march=x86-64", "-mtune=native", "-mno-mmx"),
    (Isa.GENERIC, ARM): ("-march=armv8-a",),
    (Isa.AVX2, X86): ("-march=x86-64-v3", "-mtune=native"),
    (Isa.AVX512, X86): ("-march=native", "-mprefer-vector-width=512"),
    (Isa.NEON, ARM): ("-march=native",),
}


@dataclass(frozen=True, slots=True)
class CpuIsa:
    """A tier with its extensions, on one architecture."""

    tier: Isa
    extras: frozenset[IsaExtra]
    arch: str

    def describe(self) -> str:
        return describe_isa(self.tier, self.extras)

    def march(self) -> tuple[str, ...]:
        """The compiler's -march/-mtune flags for code of this tier."""
        return MARCH.get((self.tier, self.arch), ("-march=native",))


def describe_isa(tier: Isa, extras: frozenset[IsaExtra]) -> str:
    """`avx512 (vbmi, vnni, bf16)`, `avx2`: the tier and its extensions."""
    names = [e.value for e in IsaExtra if e in extras]
    return f"{tier.value} ({', '.join(names)})" if names else tier.value


def machine_arch() -> str:
    """This machine's architecture as the tiers name it (x86_64, aarch64, or what platform says)."""
    arch = platform.machine().lower()
    return {"amd64": X86, "arm64": ARM}.get(arch, arch)


def missing_flags(tier: Isa, flags: frozenset[str], arch: str) -> list[str]:
    """The cpuinfo flags `tier` needs that the CPU lacks (all of them on another architecture)."""
    other = ARCH[tier] is not None and ARCH[tier] != arch
    return [f for f in REQUIRED[tier] if other or f not in flags]


def _extras(tier: Isa, flags: frozenset[str]) -> frozenset[IsaExtra]:
    return frozenset(e for e, need in EXTRAS.get(tier, {}).items() if all(f in flags for f in need))


def detect_isa(flags: frozenset[str], arch: str) -> CpuIsa:
    """The highest tier whose flags the CPU has (x86: `flags`; aarch64: `Features`)."""
    for tier in (Isa.AVX512, Isa.AVX2, Isa.NEON):
        if not missing_flags(tier, flags, arch):
            return CpuIsa(tier, _extras(tier, flags), arch)
    return CpuIsa(Isa.GENERIC, frozenset(), arch)


def parse_isa(value: object) -> Isa | None:
    """The tier an `isa` option value names (None for "auto": this CPU's own); VfuseOptionError otherwise."""
    if isinstance(value, Isa):
        return value
    if isinstance(value, str) and value.lower() == "auto":
        return None
    if isinstance(value, str) and value.lower() in {t.value for t in Isa}:
        return Isa(value.lower())
    accepted = ", ".join(repr(v) for v in isa_names())
    raise VfuseOptionError(f"vfuse option isa={value!r} is not accepted; accepted: {accepted}")


def isa_names() -> tuple[str, ...]:
    return ("auto", *(t.value for t in Isa))


ENV_VAR = "VFUSE_ISA"


def env_isa() -> Isa | None:
    """The tier VFUSE_ISA names (None when unset or "auto"): what `auto` compiles for, process-wide,
    so that tools and tests that build with default options follow it too."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    try:
        return parse_isa(value)
    except VfuseOptionError as e:
        raise VfuseOptionError(f"{e} (set by the environment variable {ENV_VAR})") from None


def resolve_isa(requested: Isa | None, flags: frozenset[str], arch: str) -> CpuIsa:
    """The tier to compile for: `requested`, else VFUSE_ISA's, else the CPU's own, with the CPU's
    extensions of that tier; a tier the CPU lacks raises VfuseOptionError naming what is missing."""
    native = detect_isa(flags, arch)
    from_env = requested is None and env_isa() is not None
    requested = requested or env_isa()
    if requested is None or requested is native.tier:
        return native
    missing = missing_flags(requested, flags, arch)
    if missing:
        lacks = f"the flags {' '.join(missing)}"
        if ARCH[requested] != arch:
            lacks = f"{lacks} of an {ARCH[requested]} CPU (this one is {arch})"
        source = f" (set by the environment variable {ENV_VAR})" if from_env else ""
        raise VfuseOptionError(
            f"vfuse option isa={requested.value!r}{source} is not available on this CPU (its tier is "
            f"{native.describe()}): it lacks {lacks}; code built for it would stop with SIGILL"
        )
    return CpuIsa(requested, _extras(requested, flags), arch)
