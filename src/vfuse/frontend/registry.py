"""The lowering table: aten op (overload or overload packet) -> function that emits IR for it.

The per-family modules (`lower_pointwise`, `lower_reduce`, ...) fill the table at import time
with the `lowers` decorator; it is a static table like the IR's OpDef registry, never changed
while compiling. An exact overload entry wins over its packet's entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

if TYPE_CHECKING:
    from vfuse.frontend.emitter import Emitter, Lowered

LowerFn = Callable[["Emitter", torch.fx.Node], "Lowered"]

_TABLE: dict[Any, LowerFn] = {}


def lowers(*targets: Any) -> Callable[[LowerFn], LowerFn]:
    """Register the decorated function for each aten overload or overload packet in `targets`."""

    def wrap(fn: LowerFn) -> LowerFn:
        for t in targets:
            if t in _TABLE:
                raise ValueError(f"{t} has two lowerings ({_TABLE[t].__name__} and {fn.__name__})")
            _TABLE[t] = fn
        return fn

    return wrap


def lowering_for(target: Any) -> LowerFn | None:
    """The lowering of an FX call target, or None if vfuse runs it through torch."""
    _ensure_loaded()
    fn = _TABLE.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = _TABLE.get(target.overloadpacket)
    return fn


def lowered_targets() -> frozenset[Any]:
    _ensure_loaded()
    return frozenset(_TABLE)


def _ensure_loaded() -> None:
    # The family modules import this one, so they are imported lazily on first lookup.
    if not _TABLE:
        from vfuse.frontend import (  # noqa: F401
            lower_gather,
            lower_layout,
            lower_linalg,
            lower_nn,
            lower_pointwise,
            lower_random,
            lower_reduce,
            lower_source,
        )
