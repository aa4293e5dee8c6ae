"""Graph sources (inputs, constants, fills, iota) and the torch fallback ops."""

from __future__ import annotations

from typing import Any

import torch

from vfuse.ir.defs import rules
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import TensorType, TupleType, Type


def _not_executable(*args: Any) -> torch.Tensor:
    raise RuntimeError("INPUT nodes are bound by the executor, not computed")


register(
    OpDef(
        Op.INPUT,
        Kind.SOURCE,
        0,
        lambda ins, attrs: attrs["type"],
        _not_executable,
        rules.no_flops,
        attrs=("index", "type"),
        bytes=rules.no_bytes,
        doc="the index-th positional input of the compiled callable",
        pure=False,
    )
)
register(
    OpDef(
        Op.CONSTANT,
        Kind.SOURCE,
        0,
        lambda ins, attrs: TensorType.of(attrs["value"].tensor),
        lambda attrs: attrs["value"].tensor,
        rules.no_flops,
        attrs=("value",),
        bytes=rules.no_bytes,
        doc="a tensor captured at compile time (a ConstValue, compared by identity)",
    )
)
register(
    OpDef(
        Op.FULL,
        Kind.ELEMENTWISE,
        0,
        lambda ins, attrs: TensorType(attrs["shape"], attrs["dtype"]),
        lambda attrs: torch.full(attrs["shape"], attrs["value"], dtype=attrs["dtype"].torch),
        rules.no_flops,
        attrs=("value", "shape", "dtype"),
        bytes=rules.output_bytes,
        doc="a tensor filled with one scalar; shape () is how scalars enter the IR",
    )
)
register(
    OpDef(
        Op.IOTA,
        Kind.ELEMENTWISE,
        0,
        lambda ins, attrs: TensorType((attrs["length"],), attrs["dtype"]),
        lambda attrs: torch.arange(
            attrs["start"], attrs["start"] + attrs["step"] * attrs["length"], attrs["step"], dtype=attrs["dtype"].torch
        )[: attrs["length"]],
        rules.per_element(1),
        attrs=("length", "start", "step", "dtype"),
        bytes=rules.output_bytes,
        doc="start + step * i for i in range(length)",
    )
)


def _opaque_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    return attrs["out_type"]


def _opaque_ref(*args: Any) -> Any:
    attrs: Attrs = args[-1]
    return attrs["call"].run(list(args[:-1]))


register(
    OpDef(
        Op.OPAQUE,
        Kind.OPAQUE,
        None,
        _opaque_infer,
        _opaque_ref,
        rules.no_flops,
        attrs=("call", "out_type"),
        doc="a torch op vfuse does not lower; `call` (frontend.opaque.OpaqueCall) runs it through torch",
        pure=False,
    )
)


def _get_item_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    (t,) = ins
    if not isinstance(t, TupleType):
        raise rules.TypeRuleError(f"get_item needs a tuple, got {t}")
    return t.items[attrs["index"]]


register(
    OpDef(
        Op.GET_ITEM,
        Kind.OPAQUE,
        1,
        _get_item_infer,
        lambda t, attrs: t[attrs["index"]],
        rules.no_flops,
        attrs=("index",),
        bytes=rules.no_bytes,
        doc="the index-th tensor of an Opaque node that returns several",
        pure=False,
    )
)
