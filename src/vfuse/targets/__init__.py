"""Hardware targets: `get_target("cpu" | "a100" | "h100" | "h200")`."""

from __future__ import annotations

from pathlib import Path

from vfuse.targets.presets import PRESETS
from vfuse.targets.target import Target

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vfuse"


def get_target(name: str, cache_dir: Path | None = None, remeasure: bool = False) -> Target:
    """The named target. `cpu` is this machine, measured once and cached in `cache_dir`
    (default ~/.cache/vfuse); `remeasure=True` ignores the cache and rewrites it."""
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    if key == "cpu":
        from vfuse.targets.cpu import cpu_target

        return cpu_target(cache_dir or DEFAULT_CACHE_DIR, remeasure)
    raise ValueError(f"unknown target {name!r}; known: cpu, {', '.join(sorted(PRESETS))}")


__all__ = ["PRESETS", "Target", "get_target"]
