"""Conv-BN folding: CONV2D followed by per-channel affine ops on constants -> one CONV2D + bias.

Eval-mode BatchNorm lowers to (y - mean) * rsqrt(var + eps) * weight + bias with every
parameter reshaped to (1, C, 1, 1) (see frontend/lower_nn.py), and a conv bias to a
(1, C, 1, 1) ADD. Rather than matching that spelling, the pass follows the conv's single-user
chain of ADD / SUB / MUL / DIV whose other operand folds to a per-channel constant, composes
them into y * a + b per output channel (in float64), and replaces the chain by

    CONV2D(x, w * a[:, None, None, None]) + b.reshape(1, C, 1, 1)

with both as new CONSTANT nodes. It needs the conv weight and every BN value to be constants:
with parameters lifted to INPUT nodes (the default of export) the graph is left unchanged, so
folding requires frozen parameters (an option that turns parameter inputs into CONSTANTs).
A chain without any MUL/DIV (a bare conv bias) is left as is: there is nothing to fold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vfuse.interp import run_node
from vfuse.ir import Attrs, ConstValue, Graph, GraphBuilder, Node, Op, TensorType, opdef
from vfuse.passes.dce import dce

_CONST_LIMIT = 1 << 24  # elements: larger values are not evaluated at compile time


def constant_value(graph: Graph, name: str) -> torch.Tensor | None:
    """Evaluate `name` at compile time if it depends on constants only (and is small enough)."""
    needed, stack = set(), [name]
    while stack:
        n = stack.pop()
        node = graph[n]
        if not opdef(node.op).pure or not isinstance(node.type, TensorType) or node.type.numel > _CONST_LIMIT:
            return None
        if n not in needed:
            needed.add(n)
            stack.extend(node.inputs)
    values: dict[str, torch.Tensor] = {}
    for node in graph.nodes:
        if node.name in needed:
            values[node.name] = run_node(node, [values[i] for i in node.inputs])
    return values[name]


@dataclass(frozen=True)
class _Fold:
    conv: str
    chain: tuple[str, ...]  # the affine ops after the conv, in order; the last is replaced
    scale: torch.Tensor  # a[c], float64
    shift: torch.Tensor  # b[c], float64


def _per_channel(graph: Graph, name: str, channels: int) -> torch.Tensor | None:
    """The value as a float64 [C] vector if it is a constant broadcasting per channel of NCHW."""
    t = constant_value(graph, name)
    if t is None or t.dim() > 4 or not t.dtype.is_floating_point:
        return None
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    if shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, channels):
        return None
    return t.reshape(-1).to(torch.float64).expand(channels)


def _step(graph: Graph, node: Node, cur: str, channels: int) -> tuple[str, torch.Tensor, bool] | None:
    """(op, per-channel constant, cur is the left operand) if `node` is affine in `cur`."""
    if node.op not in (Op.ADD, Op.SUB, Op.MUL, Op.DIV) or node.type != graph[cur].type:
        return None
    a, b = node.inputs
    if a == b:
        return None
    left = a == cur
    if node.op is Op.DIV and not left:  # c / y is not affine in y
        return None
    t = _per_channel(graph, b if left else a, channels)
    return None if t is None else (node.op.name, t, left)


def _match(graph: Graph, conv: Node) -> _Fold | None:
    if graph[conv.inputs[1]].op is not Op.CONSTANT:
        return None
    channels = conv.tensor_type.shape[1]
    scale, shift = torch.ones(channels, dtype=torch.float64), torch.zeros(channels, dtype=torch.float64)
    chain: list[str] = []
    cur = conv.name
    while len(graph.users(cur)) == 1 and not graph.is_output(cur):
        node = graph[graph.users(cur)[0]]
        step = _step(graph, node, cur, channels)
        if step is None:
            break
        op, t, left = step
        if op == "ADD":
            shift = shift + t
        elif op == "SUB":
            scale, shift = (scale, shift - t) if left else (-scale, t - shift)
        else:
            t = t if op == "MUL" else 1.0 / t
            scale, shift = scale * t, shift * t
        chain.append(node.name)
        cur = node.name
    if not any(graph[n].op in (Op.MUL, Op.DIV) for n in chain):
        return None
    return _Fold(conv.name, tuple(chain), scale, shift)


def _emit(b: GraphBuilder, graph: Graph, fold: _Fold, x: str) -> None:
    """The folded conv (named like the old conv) and its bias ADD (named like the chain's end)."""
    conv, last = graph[fold.conv], graph[fold.chain[-1]]
    w = graph[conv.inputs[1]].attrs["value"].tensor
    w_new = (w.to(torch.float64) * fold.scale[:, None, None, None]).to(w.dtype)
    bias = fold.shift.reshape(1, -1, 1, 1).to(last.tensor_type.dtype.torch)
    w_name = b.add(Op.CONSTANT, name=f"{conv.name}_w_folded", value=ConstValue(w_new))
    b_name = b.add(Op.CONSTANT, name=f"{conv.name}_b_folded", value=ConstValue(bias))
    b.add_node(Node(conv.name, Op.CONV2D, (x, w_name), conv.attrs, conv.type, conv.origin))
    b.add_node(Node(last.name, Op.ADD, (conv.name, b_name), Attrs.of(), last.type, last.origin))


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold per-channel constant affine chains (eval BatchNorm, conv bias) into CONV2D weights."""
    folds = {f.chain[-1]: f for n in graph.nodes if n.op is Op.CONV2D and (f := _match(graph, n)) is not None}
    if not folds:
        return graph
    dropped = {n for f in folds.values() for n in (f.conv, *f.chain)}
    b = GraphBuilder(reserved=[n.name for n in graph.nodes])
    for node in graph.nodes:
        if node.name in folds:
            _emit(b, graph, folds[node.name], graph[folds[node.name].conv].inputs[0])
        elif node.name not in dropped:
            b.add_node(node)
    return dce(b.build(graph.outputs))
