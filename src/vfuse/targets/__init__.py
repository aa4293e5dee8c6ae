"""Hardware targets: `get_target("cpu" | "a100" | "h100" | "h200")`."""

from __future__ import annotations

from pathlib import Path

from vfuse.targets.isa import Isa, IsaExtra, parse_isa
from vfuse.targets.presets import PRESETS
from vfuse.targets.target import Target

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vfuse"


def get_target(
    name: str, cache_dir: Path | None = None, remeasure: bool = False, isa: Isa | str | None = None
) -> Target:
    """The named target. `cpu` is this machine, measured once and cached in `cache_dir`
    (default ~/.cache/vfuse); `remeasure=True` ignores the cache and rewrites it. `isa` compiles for a lower
    instruction-set tier ("auto" or None: VFUSE_ISA's, else the CPU's own); one the CPU lacks raises
    VfuseOptionError. GPU presets have no tier and ignore it."""
    key = name.lower()
    tier = parse_isa("auto" if isa is None else isa)
    if key in PRESETS:
        return PRESETS[key]
    if key == "cpu":
        from vfuse.targets.cpu import cpu_target

        return cpu_target(cache_dir or DEFAULT_CACHE_DIR, remeasure, tier)
    raise ValueError(f"unknown target {name!r}; known: cpu, {', '.join(sorted(PRESETS))}")


__all__ = ["PRESETS", "Isa", "IsaExtra", "Target", "get_target"]
