"""Hardware targets: `get_target("cpu" | "a100" | "h100" | "h200")`."""

from __future__ import annotations

import os
from pathlib import Path

from vfuse.targets.isa import Isa, IsaExtra, parse_isa
from vfuse.targets.presets import PRESETS
from vfuse.targets.target import Target

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vfuse"
CACHE_ENV = "VFUSE_CACHE_DIR"  # the `cache_dir` option's variable (context.ENV_VARS)


def default_cache_dir() -> Path:
    """VFUSE_CACHE_DIR, else ~/.cache/vfuse: where the cpu target is cached when no directory is
    passed, the same one `Options.from_env().cache_dir` names, so a target looked up directly and a
    compile's target read one measurement and one calibration."""
    value = os.environ.get(CACHE_ENV)
    return Path(value) if value else DEFAULT_CACHE_DIR


def get_target(
    name: str,
    cache_dir: Path | None = None,
    remeasure: bool = False,
    isa: Isa | str | None = None,
    calibrated: bool | None = None,
) -> Target:
    """The named target. `cpu` is this machine, measured once and cached in `cache_dir`
    (default: `default_cache_dir()`); `remeasure=True` ignores the cache and rewrites it. `isa` compiles
    for a lower instruction-set tier ("auto" or None: VFUSE_ISA's, else the CPU's own); one the CPU lacks
    raises VfuseOptionError. `calibrated`: apply the tier's cached `vfuse calibrate` rates (None:
    VFUSE_CALIBRATION, on unless it says off). GPU presets have no tier and ignore both."""
    key = name.lower()
    tier = parse_isa("auto" if isa is None else isa)
    if key in PRESETS:
        return PRESETS[key]
    if key == "cpu":
        from vfuse.targets.cpu import cpu_target

        return cpu_target(cache_dir or default_cache_dir(), remeasure, tier, calibrated)
    raise ValueError(f"unknown target {name!r}; known: cpu, {', '.join(sorted(PRESETS))}")


__all__ = ["PRESETS", "Isa", "IsaExtra", "Target", "default_cache_dir", "get_target"]
