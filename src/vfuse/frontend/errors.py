"""Errors of the frontend: what failed to lower, named by FX node, aten op and input types."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def describe_value(v: Any) -> str:
    """Short form of an FX argument's value for messages: `f32[2,3]` for tensors, repr otherwise."""
    if isinstance(v, torch.fx.Node):
        v = v.meta.get("val", v.name)
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(describe_value(x) for x in v) + "]"
    return repr(v)


class LoweringError(RuntimeError):
    """An FX node could not be lowered to vfuse IR.

    Raised for every node failure in strict mode, and always for graphs the IR cannot express
    at all (symbolic shapes, non-tensor outputs, mutating ops, unsupported dtypes).
    """

    def __init__(self, node: torch.fx.Node | None, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(self._format(node, reason))

    @staticmethod
    def _format(node: torch.fx.Node | None, reason: str) -> str:
        if node is None:
            return reason
        args = ", ".join(describe_value(a) for a in node.args)
        kwargs = "".join(f", {k}={describe_value(v)}" for k, v in node.kwargs.items())
        return f"cannot lower FX node '{node.name}' = {node.target}({args}{kwargs}): {reason}"


class Fallback(Exception):  # a signal ("run this node through torch"), not an error
    """Raised by a lowering to say 'this case is meant to run through torch' (an OPAQUE node).

    Unlike other exceptions it is a design decision (e.g. transposed convolution), so strict
    mode does not turn it into a LoweringError.
    """
