"""`lower(gm, ctx)`: an ATen-level FX graph -> a vfuse IR Graph.

Walks the FX graph once in order. Placeholders become INPUT nodes, get_attr tensors become
CONSTANTs, every call goes through the lowering table (`registry`); an op without a lowering,
or whose lowering fails, becomes an OPAQUE node that runs it through torch, so the result is
never wrong, only less fused. In strict mode a failing lowering raises LoweringError instead.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from vfuse.context import Context
from vfuse.frontend.emitter import Emitter, OpaqueTuple, tensor_type_of
from vfuse.frontend.errors import Fallback, LoweringError
from vfuse.frontend.lowerings import lowering_for
from vfuse.frontend.opaque import emit_opaque
from vfuse.frontend.symbols import SYMBOLIC, is_size_node, sized_args, take_assert, to_size
from vfuse.ir import ConstValue, Graph, Op, TensorType
from vfuse.ir.sym import SymEnv
from vfuse.targets import Target


def lower(gm: torch.fx.GraphModule, ctx: Context, symbols: SymEnv | None = None, target: Target | None = None) -> Graph:
    """Lower `gm` (functional ATen ops, node.meta['val'] set) to IR. Symbolic sizes need
    `symbols` (frontend/symbols.py: `sym_env(gm)`); without it the shapes must be concrete.
    `target`: the machine the compilation plans for (default: ctx's, resolved on first use)."""
    em = Emitter(gm, ctx, symbols=symbols, target=target)
    outputs: list[str] = []
    n_inputs = 0
    for node in gm.graph.nodes:
        em.begin(node)
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, SYMBOLIC):  # a size argument: read at run time, no tensor
                em.env[node.name] = to_size(symbols, val)
            else:
                em.env[node.name] = em.add_input(n_inputs, tensor_type_of(val, node, symbols), node.name)
            n_inputs += 1
        elif node.op == "get_attr":
            em.env[node.name] = _lower_get_attr(em, node)
        elif node.op == "call_function" and is_size_node(node):
            take_assert(symbols, node)  # size arithmetic itself reaches the IR as SymSizes
        elif node.op == "call_function":
            with sized_args(symbols, node):
                _lower_call(em, node)
        elif node.op == "output":
            outputs = _outputs(em, node)
        else:
            raise LoweringError(node, f"unsupported FX node kind '{node.op}'")
    return em.build(outputs)


def _lower_get_attr(em: Emitter, node: torch.fx.Node) -> Any:
    value: Any = em.gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        return value  # e.g. a submodule of a higher-order op: passed through to torch as is
    tensor_type_of(value, node, em.symbols)
    return em.add_named(Op.CONSTANT, node.name, value=ConstValue(value.detach()))


def _outputs(em: Emitter, node: torch.fx.Node) -> list[str]:
    names = []
    for arg in pytree.tree_leaves(node.args[0]):
        v = em.env.get(arg.name) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(v, str):
            raise LoweringError(node, f"graph output {arg!r} is not a tensor")
        names.append(v)
    return names


def _lower_call(em: Emitter, node: torch.fx.Node) -> None:
    target = node.target
    if target is operator.getitem:
        em.commit(node, _getitem(em, node))
        return
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        raise LoweringError(node, "the op mutates its inputs; vfuse lowers functional graphs only")
    if not node.users:
        # Dead code or a check such as aten._assert_tensor_metadata; the graph is functional,
        # so dropping an unused value changes nothing.
        return
    fn = lowering_for(target)
    if fn is None:
        em.commit(node, emit_opaque(em, node, "no lowering"))
        return
    try:
        em.commit(node, _checked(em, node, fn(em, node)))
    except LoweringError:
        raise
    except Fallback as e:
        em.rollback()
        em.commit(node, emit_opaque(em, node, str(e)))
    except Exception as e:
        # Any other failure (a type rule rejecting a dtype, an unexpected argument form) is a
        # gap in vfuse, not in the program: run the node through torch unless strict.
        if em.ctx.options.strict:
            raise LoweringError(node, f"{type(e).__name__}: {e}") from e
        em.rollback()
        em.commit(node, emit_opaque(em, node, f"lowering failed: {e}"))


def _checked(em: Emitter, node: torch.fx.Node, result: Any) -> Any:
    """`result`, where its shape is the one torch gives the node (fixed sizes); else the node runs
    through torch. A lowering that disagrees with torch's shape would compute other values, and a
    kernel reading a torch step's smaller output reads past it (a conv of 0 input channels: torch
    gives (N, 0, H, W), vfuse (N, Cout, H, W) and a segfault; found by make fuzz, session 24)."""
    val = node.meta.get("val")
    if isinstance(result, str) and isinstance(val, torch.Tensor) and result in em.types:
        want = tuple(val.shape)
        got = em.types[result]
        shape = tuple(got.shape) if isinstance(got, TensorType) else None
        if shape is not None and all(type(d) is int for d in (*want, *shape)) and shape != want:
            raise Fallback(f"lowered to shape {list(shape)} where torch gives {list(want)}")
    return result


def _getitem(em: Emitter, node: torch.fx.Node) -> Any:
    parent, index = node.args
    v = em.env[parent.name]  # type: ignore[union-attr]
    if isinstance(v, OpaqueTuple):
        if index not in v.items:
            raise LoweringError(node, f"element {index} of an opaque result is not a tensor")
        return em.emit(Op.GET_ITEM, (v.name,), index=v.items[index])
    if isinstance(v, tuple | list) and v[index] is not None:  # type: ignore[index]
        return v[index]  # type: ignore[index]
    raise LoweringError(node, f"element {index} of '{parent}' was not produced by its lowering")
