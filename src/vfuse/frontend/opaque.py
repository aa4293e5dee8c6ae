"""The fallback: an FX node vfuse does not lower becomes an OPAQUE node that calls torch.

The node's tensor arguments become the OPAQUE node's inputs (ArgSlot(i) in the recorded
call); everything else is passed to torch unchanged. Results that mix tensors with other
values (e.g. the SymInts of flash attention) are trimmed to their tensors by `TensorItems`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from vfuse.frontend.emitter import Emitter, Lowered, OpaqueTuple, tensor_type_of
from vfuse.frontend.errors import LoweringError
from vfuse.ir import Op, TupleType
from vfuse.ir.opaque import ArgSlot, OpaqueCall


@dataclass(frozen=True, slots=True)
class TensorItems:
    """Calls `target` and keeps only the tuple items at `keep` (the tensors), in order."""

    target: Any
    keep: tuple[int, ...]

    @property
    def __name__(self) -> str:  # OpaqueCall.name shows the torch op, not this wrapper
        return str(self.target)

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        out = self.target(*args, **kwargs)
        return tuple(out[i] for i in self.keep)


def emit_opaque(em: Emitter, node: torch.fx.Node, reason: str) -> Lowered | OpaqueTuple:
    """Emit OPAQUE(node's tensor args) calling node.target; `reason` is kept for reports."""
    inputs: list[str] = []

    def slot(a: torch.fx.Node) -> Any:
        v = em.env[a.name]
        if not isinstance(v, str):
            return v  # a non-tensor value (e.g. a submodule) goes to torch as is
        inputs.append(v)
        return ArgSlot(len(inputs) - 1)

    args, kwargs = pytree.tree_map_only(torch.fx.Node, slot, (tuple(node.args), dict(node.kwargs)))
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        call = OpaqueCall(node.target, args, tuple(kwargs.items()))
        return em.emit(Op.OPAQUE, inputs, call=call, out_type=tensor_type_of(val, node, em.symbols), reason=reason)
    if not isinstance(val, tuple | list):
        raise LoweringError(node, f"result {val!r} is neither a tensor nor a tuple of tensors")
    keep = tuple(i for i, v in enumerate(val) if isinstance(v, torch.Tensor))
    target = node.target if len(keep) == len(val) else TensorItems(node.target, keep)
    call = OpaqueCall(target, args, tuple(kwargs.items()))
    out_type = TupleType(tuple(tensor_type_of(val[i], node, em.symbols) for i in keep))
    name = em.emit(Op.OPAQUE, inputs, call=call, out_type=out_type, reason=reason)
    return OpaqueTuple(name, {fx_index: item for item, fx_index in enumerate(keep)})
