"""Constant graph outputs (None gradients, sizes a specialized forward saves) around the compiled
graph, and trace_aten's graphs free of dead getitems of None results."""

from __future__ import annotations

import operator

import torch
import torch.fx

from vfuse.entry.outputs import COMPUTED, all_computed, with_none_outputs, without_none_outputs
from vfuse.entry.trace import trace_aten


def _graph_with_constant_outputs() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    graph.output((y, None, 3, x, 0, 2.5))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_constant_outputs_are_removed_and_put_back_in_place() -> None:
    gm = _graph_with_constant_outputs()
    tensors_only, slots = without_none_outputs(gm)
    assert slots == (COMPUTED, None, 3, COMPUTED, 0, 2.5) and not all_computed(slots)
    x = torch.randn(5)
    computed = tensors_only(x)
    assert len(computed) == 2
    got = with_none_outputs(computed, slots)
    assert got[1:3] == [None, 3] and got[4:] == [0, 2.5]
    torch.testing.assert_close(got[0], x * x)
    torch.testing.assert_close(got[3], x)


def test_all_tensor_outputs_leave_the_graph_unchanged() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((x, graph.call_function(torch.ops.aten.neg.default, (x,))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    same, slots = without_none_outputs(gm)
    assert same is gm and all_computed(slots) and len(slots) == 2


def test_trace_aten_drops_getitems_of_unrequested_gradients() -> None:
    def weight_grad(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        mask = [False, True, False]
        return torch.ops.aten.convolution_backward(grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)[1]

    args = (torch.randn(2, 4, 5, 5), torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3))
    gm = trace_aten(weight_grad, args)
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert [n.args[1] for n in getitems] == [1]
    torch.testing.assert_close(gm(*args), weight_grad(*args))
