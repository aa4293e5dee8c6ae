"""The explicit compile context passed to every stage: options, target, dump directory.

There is no global compiler state: anything a stage needs to know comes through here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vfuse.errors import VfuseOptionError

BACKENDS = ("auto", "cpp", "interp", "triton")
GPU_TARGETS = ("a100", "h100", "h200")
_FLAGS = ("strict", "raise_codegen_errors", "static_outputs", "freeze", "verify", "cuda_graphs", "autotune")
# Options an environment variable sets (keyword arguments win over it).
ENV_VARS = {
    "strict": "VFUSE_STRICT",
    "raise_codegen_errors": "VFUSE_RAISE_CODEGEN_ERRORS",
    "verify": "VFUSE_VERIFY",
    "backend": "VFUSE_BACKEND",
    "isa": "VFUSE_ISA",
    "dump_dir": "VFUSE_DUMP",
    "cache_dir": "VFUSE_CACHE_DIR",
    "cuda_graphs": "VFUSE_CUDA_GRAPHS",
    "autotune": "VFUSE_AUTOTUNE",
}


@dataclass(frozen=True)
class Options:
    """User-facing knobs. Environment variables give defaults; keyword arguments win.

    strict: raise on an internal compile failure instead of warning and running eagerly.
    raise_codegen_errors: raise VfuseCodegenError where vfuse builds native code it cannot
        compile (g++ rejects it, or scheduling/rendering fails): always a vfuse bug. Without it
        the graph runs on the reference executor with a warning (env VFUSE_RAISE_CODEGEN_ERRORS;
        the test suite sets it).
    backend: "cpp" (generated C++), "interp" (reference executor), "auto" (cpp if a
        C++ compiler works, else interp with a warning) or "triton" (Triton kernels for a GPU
        target; CPU tensors run them in Triton's interpreter: docs/gpu.md).
    target: name of the hardware target the planner plans for ("cpu", "a100", "h100", "h200").
    isa: instruction-set tier of the generated code: "auto" (VFUSE_ISA's, else this CPU's own) or a
        lower one the CPU has ("generic", "avx2", "avx512", "neon"); one it lacks is refused.
    dump_dir: write every stage's printed form here (env VFUSE_DUMP).
    cache_dir: kernel cache (env VFUSE_CACHE_DIR, default ~/.cache/vfuse).
    static_outputs: reuse output buffers across calls (faster; an output is overwritten by
        the next call, so callers must copy what they keep).
    freeze: in inference (no grad), treat parameters and buffers as constants so Conv-BN folding
        and constant evaluation apply; later in-place weight updates are then not seen.
    verify: check the IR's invariants after lowering and after every optimization pass (a debug
        mode: env VFUSE_VERIFY; the test suite sets it); a broken one raises IRError naming the pass.
    cuda_graphs: backend="triton" on CUDA tensors: capture each graph into a CUDA graph after a
        warm-up call and replay it (env VFUSE_CUDA_GRAPHS=0 turns it off; docs/gpu.md).
    autotune: backend="triton" on CUDA tensors: the first call times the contraction templates'
        candidate tiles and keeps the fastest, cached (env VFUSE_AUTOTUNE=0: the table's tiles).
    """

    strict: bool = False
    raise_codegen_errors: bool = False
    backend: str = "auto"
    target: str = "cpu"
    isa: str = "auto"
    dump_dir: Path | None = None
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "vfuse")
    static_outputs: bool = False
    freeze: bool = False
    verify: bool = False
    cuda_graphs: bool = True
    autotune: bool = True

    def __post_init__(self) -> None:
        """Check every value (and normalize an unambiguous spelling: target="H100" is "h100")."""
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise _rejected(name, getattr(self, name), "True or False")
        hint = " (vfuse generates CPU code; target= plans for a GPU without running on one)"
        object.__setattr__(self, "backend", _choice("backend", self.backend, BACKENDS, hint))
        object.__setattr__(self, "target", _choice("target", self.target, target_names()))
        object.__setattr__(self, "isa", _isa(self.isa))
        if self.backend == "triton" and self.target not in GPU_TARGETS:
            raise _rejected("target", self.target, ", ".join(map(repr, GPU_TARGETS)), " with backend='triton'")
        if self.dump_dir is not None:
            object.__setattr__(self, "dump_dir", _path("dump_dir", self.dump_dir))
        object.__setattr__(self, "cache_dir", _path("cache_dir", self.cache_dir))

    @staticmethod
    def from_env(**overrides: Any) -> Options:
        """Options from the environment (ENV_VARS), overridden by the keywords that are not None."""
        unknown = sorted(set(overrides) - set(option_names()))
        if unknown:
            raise VfuseOptionError(f"unknown vfuse option {unknown[0]!r}; known options: {', '.join(option_names())}")
        env = _from_environment()
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            return Options(**{**env, **given})
        except VfuseOptionError as e:
            for name in env.keys() - given.keys():  # say which variable, when the value came from one
                try:
                    Options(**{name: env[name]})
                except VfuseOptionError:
                    raise VfuseOptionError(f"{e} (set by the environment variable {ENV_VARS[name]})") from None
            raise

    def with_(self, **changes: Any) -> Options:
        return replace(self, **changes)


def option_names() -> tuple[str, ...]:
    """Every option's name, in declaration order."""
    return tuple(f.name for f in fields(Options))


def target_names() -> tuple[str, ...]:
    """The targets the planner knows: this machine ("cpu") and the GPU presets."""
    from vfuse.targets.presets import PRESETS  # the hardware facts; imported with the first Options

    return ("cpu", *sorted(PRESETS))


def _from_environment() -> dict[str, Any]:
    env: dict[str, Any] = {}
    for name, var in ENV_VARS.items():
        value = os.environ.get(var)
        if value:
            env[name] = value not in ("0", "false", "False") if name in _FLAGS else value
    return env


def _rejected(name: str, value: Any, accepted: str, hint: str = "") -> VfuseOptionError:
    return VfuseOptionError(f"vfuse option {name}={value!r} is not accepted; accepted: {accepted}{hint}")


def _choice(name: str, value: Any, choices: tuple[str, ...], hint: str = "") -> str:
    """`value` as one of `choices`, matched without regard to case."""
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise _rejected(name, value, ", ".join(repr(c) for c in choices), hint)


def _isa(value: Any) -> str:
    """`value` as a tier name ("auto" or one this CPU has), lower case."""
    from vfuse.targets.cpu import isa_for
    from vfuse.targets.isa import parse_isa

    tier = parse_isa(value)
    if tier is None:
        return "auto"
    isa_for(tier)  # raises naming the flags the CPU lacks
    return tier.value


def _path(name: str, value: Any) -> Path:
    if isinstance(value, str | os.PathLike) and str(value):
        return Path(value)
    raise _rejected(name, value, "a path (str or pathlib.Path)")


@dataclass(frozen=True)
class Context:
    """What one compilation knows: its options, a name for its messages (graph id) and, from the
    entry points, its number among the graphs this process compiled (which makes dumps unique)."""

    options: Options = field(default_factory=Options)
    graph_id: str = "graph0"
    serial: int | None = None

    @property
    def dump_folder(self) -> Path | None:
        """`<dump_dir>/<pid>-<serial>-<graph id>` (`<dump_dir>/<graph id>` without a serial); None
        when dumping is off."""
        if self.options.dump_dir is None:
            return None
        name = self.graph_id if self.serial is None else f"{os.getpid()}-{self.serial}-{self.graph_id}"
        return self.options.dump_dir / name

    def dump(self, stage: str, text: str) -> None:
        """Write a stage's printed form to `dump_folder/<stage>` when dumping is on."""
        folder = self.dump_folder
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (folder / stage).write_text(text if text.endswith("\n") else text + "\n")
