"""Contenders: the ways a workload's module is turned into a callable that gets timed.

All contenders run in the same process with the same thread count, so differences come
from the generated code and not from the environment. `eager` is always run: it is both the
correctness reference and the baseline of every ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

REFERENCE = "eager"
INDUCTOR = "inductor"
DEFAULT_CONTENDERS = ("eager", "inductor", "vfuse")


@dataclass(frozen=True)
class Compiled:
    """A contender's callable, and optionally how to ask its backend what it built."""

    fn: Callable[..., Any]
    stats: Callable[[], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Contender:
    """prepare_frozen: how to compile for a `frozen` workload (parameters as constants);
    None where freezing means nothing (eager, Dynamo without codegen): `prepare` is used."""

    name: str
    description: str
    prepare: Callable[[nn.Module], Compiled]
    prepare_frozen: Callable[[nn.Module], Compiled] | None = None

    def prepare_for(self, frozen: bool) -> Callable[[nn.Module], Compiled]:
        return self.prepare_frozen if frozen and self.prepare_frozen is not None else self.prepare


def _eager(module: nn.Module) -> Compiled:
    return Compiled(module)


def _inductor(module: nn.Module) -> Compiled:
    return Compiled(torch.compile(module))


def _inductor_frozen(module: nn.Module) -> Compiled:
    # options= is Inductor's per-compile config patch: torch._inductor.config.freezing is True
    # only while Inductor compiles this module's graphs and is restored after, so no other
    # contender or workload sees it. Freezing applies because the first call runs under no_grad.
    return Compiled(torch.compile(module, options={"freezing": True}))


def _vfuse(module: nn.Module, strict: bool | None = True, freeze: bool = False) -> Compiled:
    # Same as backend="vfuse" (the entry point makes a fresh backend too), but holding the
    # backend lets the report say how many kernels and fallbacks this workload compiled to.
    # Strict by default: a silent eager fallback would be timed and reported as vfuse.
    # strict=None leaves it to VFUSE_STRICT (--allow-fallback). freeze: parameters become
    # constants (Conv-BN folds, weights can be pre-packed); inference only.
    import vfuse

    backend = vfuse.backend(strict=strict, freeze=freeze)
    return Compiled(torch.compile(module, backend=backend), lambda: _jsonable(getattr(backend, "stats", {})))


def _jsonable(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in stats.items()}


def _dynamo(module: nn.Module) -> Compiled:
    # Dynamo capture with no code generation: separates guard/dispatch overhead from codegen.
    return Compiled(torch.compile(module, backend="eager"))


CONTENDERS: Mapping[str, Contender] = MappingProxyType(
    {
        c.name: c
        for c in (
            Contender("eager", "PyTorch eager (reference)", _eager),
            Contender(
                "inductor",
                'torch.compile(m), default mode; frozen workloads: options={"freezing": True}',
                _inductor,
                _inductor_frozen,
            ),
            Contender(
                "vfuse",
                'torch.compile(m, backend=vfuse.backend(strict=True)) (backend="vfuse"); frozen workloads: freeze=True',
                _vfuse,
                partial(_vfuse, freeze=True),
            ),
            Contender("dynamo", 'torch.compile(m, backend="eager"): capture overhead only', _dynamo),
        )
    }
)


def select(names: list[str] | None, allow_fallback: bool = False) -> list[Contender]:
    """Contenders by name, with eager forced to the front because everything is relative to it.

    allow_fallback: let vfuse run graphs it cannot compile eagerly (its VFUSE_STRICT default).
    """
    wanted = list(DEFAULT_CONTENDERS) if names is None else names
    unknown = [n for n in wanted if n not in CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contender(s) {', '.join(unknown)}; known: {', '.join(CONTENDERS)}")
    ordered = [REFERENCE, *(n for n in dict.fromkeys(wanted) if n != REFERENCE)]
    chosen = [CONTENDERS[n] for n in ordered]
    if allow_fallback:
        lenient, lenient_frozen = partial(_vfuse, strict=None), partial(_vfuse, strict=None, freeze=True)
        chosen = [
            replace(c, prepare=lenient, prepare_frozen=lenient_frozen) if c.prepare is _vfuse else c for c in chosen
        ]
    return chosen
