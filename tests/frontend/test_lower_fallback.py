"""The lowering's contract beyond single ops: OPAQUE fallback (never a wrong result), rollback
of failed lowerings, strict mode, LoweringError for graphs the IR cannot express, constants,
names and origins, and the decomposition table."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
from tests.frontend.lowering_helpers import check, fallbacks, lower_fn, ops_of, trace
from torch.fx.experimental.proxy_tensor import make_fx

from vfuse.context import Context, Options
from vfuse.frontend import registry
from vfuse.frontend.decompositions import decomposition_table
from vfuse.frontend.emitter import Emitter
from vfuse.frontend.errors import Fallback, LoweringError
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Op, TupleType, verify

aten = torch.ops.aten


def test_unknown_op_runs_through_torch_in_either_mode() -> None:
    x = torch.randn(3, 4)
    for strict in (False, True):
        graph = check(lambda x: torch.cumsum(x, 1) * 2, x, allow=("cumsum",), strict=strict)
        (node,) = [n for n in graph.nodes if n.op is Op.OPAQUE]
        assert node.attrs["reason"] == "no lowering" and node.name == "cumsum" and node.origin == "cumsum"
        assert ops_of(graph)[Op.MUL] == 1


def test_check_helper_rejects_unexpected_fallbacks() -> None:
    with pytest.raises(AssertionError, match="cumsum"):
        check(lambda x: torch.cumsum(x, 0), torch.randn(3))


def test_opaque_tuple_results_are_read_with_get_item() -> None:
    x = torch.randn(4, 5)
    graph = check(lambda x: (torch.sort(x, 1)[0] + 1, torch.sort(x, 1)[1]), x, allow=("sort",))
    opaque = [n for n in graph.nodes if n.op is Op.OPAQUE]
    assert all(isinstance(n.type, TupleType) for n in opaque) and ops_of(graph)[Op.GET_ITEM] >= 2


def _failing_lowering(em: Emitter, node: torch.fx.Node) -> str:
    em.emit(Op.EXP, (em.value(node.args[0]),))  # emitted, then the lowering gives up
    raise ValueError("deliberate failure")


def _patch_cumsum(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give aten.cumsum a lowering that fails halfway."""
    monkeypatch.setitem(registry.TABLE, aten.cumsum.default, _failing_lowering)


def test_failed_lowering_is_rolled_back_then_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_cumsum(monkeypatch)
    x = torch.randn(3, 4)
    graph = check(lambda x: torch.cumsum(x, 1) + 1, x, allow=("cumsum",))
    assert ops_of(graph)[Op.EXP] == 0
    assert "deliberate failure" in next(n for n in graph.nodes if n.op is Op.OPAQUE).attrs["reason"]


def test_strict_mode_turns_a_failed_lowering_into_a_lowering_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_cumsum(monkeypatch)
    with pytest.raises(LoweringError) as info:
        lower_fn(lambda x: torch.cumsum(x, 1), [torch.randn(3, 4)], strict=True)
    msg = str(info.value)
    assert "'cumsum'" in msg and "aten.cumsum.default" in msg and "float32[3, 4]" in msg and "deliberate" in msg


def test_deliberate_fallback_is_not_an_error_in_strict_mode() -> None:
    i = torch.randint(0, 5, (3, 4))
    graph = check(lambda a, b: a @ b, i, i.t().contiguous(), allow=("mm",), strict=True)
    assert fallbacks(graph)["aten.mm.default"] == 1


def _hand_graph(build: Callable[[torch.fx.Graph], Any]) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.randn(2, 3)
    g.output(build(g, x))  # type: ignore[call-arg]
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _call(g: torch.fx.Graph, target: Any, args: tuple, val: Any) -> torch.fx.Node:
    n = g.call_function(target, args)
    n.meta["val"] = val
    return n


def test_mutating_op_is_a_lowering_error() -> None:
    gm = _hand_graph(lambda g, x: (_call(g, aten.add_.Tensor, (x, x), torch.randn(2, 3)),))
    with pytest.raises(LoweringError, match="mutates"):
        lower(gm, Context())


def test_non_tensor_output_is_a_lowering_error() -> None:
    gm = _hand_graph(lambda g, x: (x, 3))
    with pytest.raises(LoweringError, match="not a tensor"):
        lower(gm, Context())


def test_symbolic_shapes_are_a_lowering_error() -> None:
    gm = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(3, 4))
    with pytest.raises(LoweringError, match="symbolic"):
        lower(gm, Context())


def test_unsupported_dtype_is_a_lowering_error() -> None:
    gm = make_fx(lambda x: x * 2, tracing_mode="fake")(torch.randn(3, dtype=torch.complex64))
    with pytest.raises(LoweringError, match="complex64"):
        lower(gm, Context())


def _pair_with_int(x: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    return x + 1, 5, x * 2


def test_tuple_result_with_non_tensor_items_keeps_the_tensors() -> None:
    def build(g: torch.fx.Graph, x: torch.fx.Node) -> tuple:
        t = torch.randn(2, 3)
        call = _call(g, _pair_with_int, (x,), (t, 5, t))
        return (_call(g, operator.getitem, (call, 0), t), _call(g, operator.getitem, (call, 2), t))

    graph = verify(lower(_hand_graph(build), Context()))
    (node,) = [n for n in graph.nodes if n.op is Op.OPAQUE]
    assert isinstance(node.type, TupleType) and len(node.type.items) == 2
    x = torch.randn(2, 3)
    a, b = run(graph, [x])
    assert torch.equal(a, x + 1) and torch.equal(b, x * 2)


def test_constants_become_constant_nodes() -> None:
    w = torch.randn(4)
    gm = make_fx(lambda x: x * w + torch.tensor([1.0, 2.0, 3.0, 4.0]), tracing_mode="real")(torch.randn(3, 4))
    graph = verify(lower(gm, Context()))
    assert ops_of(graph)[Op.CONSTANT] == 2 and not fallbacks(graph)
    x = torch.randn(3, 4)
    torch.testing.assert_close(run(graph, [x])[0], x * w + torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_values_are_named_after_fx_nodes_and_keep_their_origin() -> None:
    x = torch.randn(3, 4)
    gm = trace(lambda x: torch.nn.functional.layer_norm(x.relu(), (4,)), [x])
    graph = verify(lower(gm, Context()))
    fx_names = {n.name for n in gm.graph.nodes}
    assert "relu" in graph and graph["relu"].op is Op.RELU
    assert all(n.origin in fx_names for n in graph.nodes)
    assert set(graph.outputs) <= fx_names


def test_dead_fx_nodes_are_not_lowered() -> None:
    gm = _hand_graph(lambda g, x: (_call(g, aten.exp.default, (x,), torch.randn(2, 3)),))
    dead = gm.graph.call_function(aten.cumsum.default, (next(iter(gm.graph.nodes)), 0))
    dead.meta["val"] = torch.randn(2, 3)
    graph = verify(lower(gm, Context()))
    assert [n.op for n in graph.nodes] == [Op.INPUT, Op.EXP]


def test_lowering_error_names_node_op_and_inputs() -> None:
    gm = _hand_graph(lambda g, x: (_call(g, aten.add_.Tensor, (x, 2.0), torch.randn(2, 3)),))
    with pytest.raises(LoweringError) as info:
        lower(gm, Context(Options(strict=True)))
    assert info.value.node is not None and f"'{info.value.node.name}'" in str(info.value)
    assert "aten.add_.Tensor" in str(info.value) and "float32[2, 3]" in str(info.value)


def test_decomposition_table_keeps_what_vfuse_lowers_whole() -> None:
    table = decomposition_table()
    whole = [aten.gelu.default, aten.silu.default, aten.convolution.default, aten.addmm.default, aten.mm.default,
             aten.embedding.default, aten._softmax.default, aten.native_layer_norm.default, aten.var.correction,
             aten._scaled_dot_product_flash_attention_for_cpu.default, aten.native_dropout.default,
             aten._native_batch_norm_legit_no_training.default]  # fmt: skip
    assert not [op for op in whole if op in table]
    assert all(op in table for op in (aten.elu.default, aten.hardswish.default, aten.gelu_backward.default))
    assert aten.linear.default in table and aten.layer_norm.default in table  # composite: always decomposed


def test_fallback_exception_is_only_a_signal() -> None:
    assert not issubclass(Fallback, LoweringError)
