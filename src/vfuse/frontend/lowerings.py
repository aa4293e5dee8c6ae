"""Lookups in the complete lowering table: importing this module imports every family module,
whose `lowers` decorators fill `registry.TABLE`. An exact overload entry wins over its packet's entry.
"""

from __future__ import annotations

from typing import Any

import torch

from vfuse.frontend import (  # noqa: F401  (imported for their table entries)
    lower_attention,
    lower_backward,
    lower_conv_backward,
    lower_foreach,
    lower_fp8,
    lower_gather,
    lower_layout,
    lower_linalg,
    lower_nn,
    lower_pointwise,
    lower_pool,
    lower_random,
    lower_reduce,
    lower_source,
)
from vfuse.frontend.registry import TABLE, LowerFn


def lowering_for(target: Any) -> LowerFn | None:
    """The lowering of an FX call target, or None if vfuse runs it through torch."""
    fn = TABLE.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        # By name: ops of namespaces torch registers late (inductor's prims.fma: on first use).
        fn = TABLE.get(target.overloadpacket) or TABLE.get(str(target))
    return fn


def lowered_targets() -> frozenset[Any]:
    return frozenset(TABLE)
