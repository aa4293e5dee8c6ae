"""vfuse: a vertical-fusion compiler for PyTorch that can tell you why it fused what it fused.

torch.compile(model, backend="vfuse")        # JIT through Dynamo (no import needed)
vfuse.compile(model, example_inputs)         # ahead of time through torch.export
vfuse.explain(model, *example_inputs)        # the fusion report
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vfuse.context import Context, Options
from vfuse.errors import VfuseCompileError, VfuseError, VfuseInputError

__version__ = "0.1.0"


def backend(**options: Any) -> Any:
    """A Dynamo backend with options: `torch.compile(m, backend=vfuse.backend(strict=True))`.

    The returned object keeps what it compiled in `.compiled` and totals in `.stats`.
    """
    from vfuse.entry.capture import VfuseBackend

    return VfuseBackend(**options)


def compile(fn: Callable, example_inputs: Sequence[Any], **options: Any) -> Any:
    """Compile `fn` (an nn.Module or function) ahead of time for these example inputs' shapes."""
    from vfuse.entry.aot import compile_aot

    return compile_aot(fn, example_inputs, **options)


def explain(fn: Callable, *example_inputs: Any, target: str = "cpu", **options: Any) -> Any:
    """The FusionReport for `fn` on `target`: kernels, bytes, and every fusion decision with its reason."""
    from vfuse.report.explain import explain as _explain

    return _explain(fn, *example_inputs, target=target, **options)


__all__ = [
    "Context",
    "Options",
    "VfuseCompileError",
    "VfuseError",
    "VfuseInputError",
    "backend",
    "compile",
    "explain",
]
