"""vfuse: a vertical-fusion compiler for PyTorch that can tell you why it fused what it fused.

torch.compile(model, backend="vfuse")        # JIT through Dynamo (no import needed); options={...} as in vfuse.backend
vfuse.compile(model, example_inputs)         # ahead of time through torch.export
vfuse.explain(model, *example_inputs)        # the fusion report
vfuse.stats(), vfuse.last_compiled()         # what the compiled graphs run (natively, through torch)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from vfuse.context import Context, Options
from vfuse.errors import VfuseCompileError, VfuseError, VfuseInputError, VfuseOptionError

__version__ = "0.1.0"


def backend(**options: Any) -> Any:
    """A Dynamo backend with options: `torch.compile(m, backend=vfuse.backend(strict=True))`.

    The returned object keeps what it compiled in `.compiled` and totals in `.stats`. Options are
    checked here: an unknown name or a value not accepted raises VfuseOptionError.
    """
    from vfuse.entry.capture import VfuseBackend

    return VfuseBackend(**options)


def compile(fn: Callable, example_inputs: Sequence[Any], dynamic_shapes: Any = None, **options: Any) -> Any:
    """Compile `fn` (an nn.Module or function) ahead of time for these example inputs' shapes;
    `dynamic_shapes` (torch.export's, e.g. `{"x": {0: torch.export.Dim("batch")}}`) makes those
    sizes symbolic: one program serves every size in their ranges (docs/dynamic.md)."""
    from vfuse.entry.aot import compile_aot

    return compile_aot(fn, example_inputs, dynamic_shapes=dynamic_shapes, **options)


def explain(fn: Callable, *example_inputs: Any, target: str = "cpu", **options: Any) -> Any:
    """The FusionReport for `fn` on `target`: kernels, bytes, and every fusion decision with its reason."""
    from vfuse.report.explain import explain as _explain

    return _explain(fn, *example_inputs, target=target, **options)


def compiled_graphs() -> list[Any]:
    """The CompiledGraphs this process compiled (any entry point) that are still in use, oldest first.

    Weak: a graph drops out when whoever calls it (Dynamo's cache, a vfuse.compile result) lets go
    of it, e.g. after `torch._dynamo.reset()`.
    """
    from vfuse.entry.observe import compiled_graphs as _compiled_graphs

    return _compiled_graphs()


def last_compiled() -> Any:
    """The most recently compiled CompiledGraph still in use (None if none): `.stats`, `.plan`, `.graph`."""
    from vfuse.entry.observe import last_compiled as _last_compiled

    return _last_compiled()


def stats() -> Any:
    """A CompileStats over `compiled_graphs()` (kernels, torch calls, fallbacks by op, compile time);
    `print(vfuse.stats())` reads as text. The way to reach stats with `backend="vfuse"`."""
    from vfuse.entry.observe import stats as _stats

    return _stats()


def set_logs(
    level: int | None = logging.INFO, *, graph: bool = False, plan: bool = False, output_code: bool = False
) -> None:
    """Show vfuse's log (one line per compiled graph at INFO; DEBUG adds every artifact) and, on
    their own, each graph's optimized IR (`graph`), fusion plan (`plan`) or generated C++
    (`output_code`). It calls `torch._logging.set_logs`, so it replaces settings made that way,
    and does nothing when TORCH_LOGS is set (`TORCH_LOGS=vfuse` / `+vfuse` is the environment's way)."""
    from vfuse.entry.observe import set_logs as _set_logs

    _set_logs(level, graph=graph, plan=plan, output_code=output_code)


__all__ = [
    "Context",
    "Options",
    "VfuseCompileError",
    "VfuseError",
    "VfuseInputError",
    "VfuseOptionError",
    "backend",
    "compile",
    "compiled_graphs",
    "explain",
    "last_compiled",
    "set_logs",
    "stats",
]
