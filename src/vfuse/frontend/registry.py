"""The lowering table: aten op (overload or overload packet) -> function that emits IR for it.

The per-family modules (`lower_pointwise`, `lower_reduce`, ...) fill the table at import time
with the `lowers` decorator; `frontend.lowerings` imports every family and is where lookups
happen, so this module imports none of them. It is a static table, never changed while compiling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

if TYPE_CHECKING:
    from vfuse.frontend.emitter import Emitter, Lowered

LowerFn = Callable[["Emitter", torch.fx.Node], "Lowered"]

TABLE: dict[Any, LowerFn] = {}


def lowers(*targets: Any) -> Callable[[LowerFn], LowerFn]:
    """Register the decorated function for each aten overload or overload packet in `targets`."""

    def wrap(fn: LowerFn) -> LowerFn:
        for t in targets:
            if t in TABLE:
                raise ValueError(f"{t} has two lowerings ({TABLE[t].__name__} and {fn.__name__})")
            TABLE[t] = fn
        return fn

    return wrap
