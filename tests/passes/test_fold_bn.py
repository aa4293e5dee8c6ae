"""fold_batchnorm: Conv(+bias)-BN with constant parameters folds into one conv + bias ADD
(numerics as eager); with parameters still lifted to INPUT nodes nothing changes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tests.models.zoo import BasicBlock, randomize_bn_stats
from torch.func import functional_call

from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Attrs, ConstValue, DType, Graph, GraphBuilder, Node, Op, TensorType, format_graph, verify
from vfuse.passes import optimize
from vfuse.passes.fold_bn import fold_batchnorm


def _traced(model: torch.nn.Module, x: torch.Tensor) -> tuple[Graph, list[torch.Tensor]]:
    """IR of `model(x)` with parameters and buffers lifted to inputs 1.. (as export does)."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def fn(x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        return functional_call(model, dict(zip(state, tensors, strict=True)), (x,))

    return optimize(lower(trace_aten(fn, [x, *state.values()]), Context())), list(state.values())


def _freeze(graph: Graph, tensors: Sequence[torch.Tensor]) -> Graph:
    """Turn INPUT nodes 1.. into CONSTANT nodes holding `tensors` (what freeze=True will do)."""
    nodes = []
    for n in graph.nodes:
        i = n.attrs["index"] if n.op is Op.INPUT else 0
        if i >= 1:
            n = Node(n.name, Op.CONSTANT, (), Attrs.of(value=ConstValue(tensors[i - 1].detach())), n.type, n.origin)
        nodes.append(n)
    return verify(Graph(tuple(nodes), graph.outputs))


def _model(bias: bool, groups: int = 1, stride: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(4, 8, 3, stride=stride, padding=1, bias=bias, groups=groups),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
    )
    bn = m[1]
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-1, 1)
    return m.eval()


def _check_folded(model: torch.nn.Module, x: torch.Tensor) -> Graph:
    graph, params = _traced(model, x)
    folded = verify(fold_batchnorm(_freeze(graph, params)))
    assert [n.op for n in folded.compute_nodes] == [Op.CONV2D, Op.ADD, Op.RELU], format_graph(folded)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(run(folded, [x])[0], want, rtol=1e-4, atol=1e-5)
    return folded


def test_conv_bias_bn_folds_into_one_conv_and_bias() -> None:
    folded = _check_folded(_model(bias=True), torch.randn(2, 4, 9, 9))
    conv = next(n for n in folded.nodes if n.op is Op.CONV2D)
    assert folded[conv.inputs[1]].op is Op.CONSTANT
    add = next(n for n in folded.nodes if n.op is Op.ADD)
    assert folded[add.inputs[1]].type == TensorType((1, 8, 1, 1), DType.F32)


def test_conv_without_bias_grouped_strided() -> None:
    _check_folded(_model(bias=False, groups=2, stride=2), torch.randn(2, 4, 9, 9))


def test_lifted_parameters_leave_the_graph_unchanged() -> None:
    graph, _ = _traced(_model(bias=True), torch.randn(1, 4, 5, 5))
    assert fold_batchnorm(graph) is graph


def test_conv_output_with_a_second_user_is_not_folded() -> None:
    f32 = DType.F32
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((1, 2, 4, 4), f32))
    w = b.add(Op.CONSTANT, name="w", value=ConstValue(torch.randn(3, 2, 1, 1)))
    y = b.add(Op.CONV2D, [x, w], stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    s = b.add(Op.CONSTANT, name="s", value=ConstValue(torch.rand(1, 3, 1, 1) + 0.5))
    z = b.add(Op.MUL, [y, s])
    g = verify(b.build([z, y]))
    assert fold_batchnorm(g) is g
    # once the conv output is private, the same chain folds; the result keeps its name
    g2 = verify(b.build([z]))
    folded = verify(fold_batchnorm(g2))
    assert format_graph(folded).splitlines()[-4:-2] == [
        "  %conv2d = conv2d(%x, %conv2d_w_folded) {dilation=(1, 1), groups=1, padding=(0, 0), stride=(1, 1)} "
        ": f32[1,3,4,4]",
        "  %mul = add(%conv2d, %conv2d_b_folded) : f32[1,3,4,4]",
    ]
    xin = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(run(folded, [xin])[0], run(g2, [xin])[0], rtol=1e-4, atol=1e-6)


def test_reversed_operands_and_division_fold() -> None:
    """c - y, y / c and scalar FULL operands are affine too."""
    f32 = DType.F32
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((2, 2, 3, 3), f32))
    w = b.add(Op.CONSTANT, name="w", value=ConstValue(torch.randn(2, 2, 3, 3)))
    y = b.add(Op.CONV2D, [x, w], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    c = b.add(Op.RESHAPE, [b.add(Op.CONSTANT, value=ConstValue(torch.tensor([1.0, -2.0])))], shape=(2, 1, 1))
    y = b.add(Op.SUB, [c, y])
    y = b.add(Op.DIV, [y, b.add(Op.FULL, value=3.0, shape=(), dtype=f32)])
    g = verify(b.build([b.add(Op.TANH, [y])]))
    folded = verify(fold_batchnorm(g))
    assert [n.op for n in folded.compute_nodes] == [Op.CONV2D, Op.ADD, Op.TANH]
    xin = torch.randn(2, 2, 3, 3)
    torch.testing.assert_close(run(folded, [xin])[0], run(g, [xin])[0], rtol=1e-4, atol=1e-6)


def test_zoo_resnet_basic_block_folds_all_three_batchnorms() -> None:
    model, x = randomize_bn_stats(BasicBlock()).eval(), torch.randn(2, 8, 16, 16)
    graph, params = _traced(model, x)
    folded = verify(fold_batchnorm(_freeze(graph, params)))
    ops = [n.op for n in folded.compute_nodes]
    assert ops.count(Op.CONV2D) == 3 and ops.count(Op.ADD) == 4 and Op.RSQRT not in ops, format_graph(folded)
    with torch.no_grad():
        torch.testing.assert_close(run(folded, [x])[0], model(x), rtol=1e-4, atol=1e-5)
