"""Every op's definition, looked up by `Op`. Importing `vfuse.ir.defs` registers them all, so this
module (not `ir.ops`, which the definitions import) is where lookups happen."""

from __future__ import annotations

from vfuse.ir import defs as _defs  # noqa: F401  (registers every OpDef)
from vfuse.ir.ops import REGISTRY, Op, OpDef


def opdef(op: Op) -> OpDef:
    """The definition of `op`; every op has one (checked by tests/ir/test_ops.py)."""
    return REGISTRY[op]


def all_opdefs() -> dict[Op, OpDef]:
    return dict(REGISTRY)
