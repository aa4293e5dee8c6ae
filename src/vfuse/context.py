"""The explicit compile context passed to every stage: options, target, dump directory.

There is no global compiler state: anything a stage needs to know comes through here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Options:
    """User-facing knobs. Environment variables give defaults; keyword arguments win.

    strict: raise on an internal compile failure instead of warning and running eagerly.
    raise_codegen_errors: raise VfuseCodegenError where vfuse builds native code it cannot
        compile (g++ rejects it, or scheduling/rendering fails): always a vfuse bug. Without it
        the graph runs on the reference executor with a warning (env VFUSE_RAISE_CODEGEN_ERRORS;
        the test suite sets it).
    backend: "cpp" (generated C++), "interp" (reference executor) or "auto" (cpp if a
        C++ compiler works, else interp with a warning).
    target: name of the hardware target the planner plans for ("cpu", "a100", "h100", "h200").
    dump_dir: write every stage's printed form here (env VFUSE_DUMP).
    cache_dir: kernel cache (env VFUSE_CACHE_DIR, default ~/.cache/vfuse).
    static_outputs: reuse output buffers across calls (faster; an output is overwritten by
        the next call, so callers must copy what they keep).
    freeze: in inference (no grad), treat parameters and buffers as constants so Conv-BN folding
        and constant evaluation apply; later in-place weight updates are then not seen.
    verify: check the IR's invariants after lowering and after every optimization pass (a debug
        mode: env VFUSE_VERIFY; the test suite sets it); a broken one raises IRError naming the pass.
    """

    strict: bool = False
    raise_codegen_errors: bool = False
    backend: str = "auto"
    target: str = "cpu"
    dump_dir: Path | None = None
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "vfuse")
    static_outputs: bool = False
    freeze: bool = False
    verify: bool = False

    @staticmethod
    def from_env(**overrides: Any) -> Options:
        env: dict[str, Any] = {}
        if os.environ.get("VFUSE_DUMP"):
            env["dump_dir"] = Path(os.environ["VFUSE_DUMP"])
        if os.environ.get("VFUSE_CACHE_DIR"):
            env["cache_dir"] = Path(os.environ["VFUSE_CACHE_DIR"])
        if os.environ.get("VFUSE_BACKEND"):
            env["backend"] = os.environ["VFUSE_BACKEND"]
        for flag in ("strict", "raise_codegen_errors", "verify"):
            if os.environ.get(f"VFUSE_{flag.upper()}"):
                env[flag] = os.environ[f"VFUSE_{flag.upper()}"] not in ("", "0", "false")
        env.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(env.get("dump_dir"), str):
            env["dump_dir"] = Path(env["dump_dir"])
        if isinstance(env.get("cache_dir"), str):
            env["cache_dir"] = Path(env["cache_dir"])
        return Options(**env)

    def with_(self, **changes: Any) -> Options:
        return replace(self, **changes)


@dataclass(frozen=True)
class Context:
    """What one compilation knows: its options and a name for its dumps (graph id)."""

    options: Options = field(default_factory=Options)
    graph_id: str = "graph0"

    def dump(self, stage: str, text: str) -> None:
        """Write a stage's printed form to `<dump_dir>/<graph_id>/<stage>` when dumping is on."""
        if self.options.dump_dir is None:
            return
        folder = self.options.dump_dir / self.graph_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / stage).write_text(text if text.endswith("\n") else text + "\n")
