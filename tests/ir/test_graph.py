"""Graph structure, printer and verifier."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vfuse.interp import run
from vfuse.ir import DType, Graph, GraphBuilder, IRError, Op, TensorType, format_graph, verify
from vfuse.ir.defs.rng import uniform


def _small() -> tuple[Graph, str]:
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((2, 3), DType.F32))
    h = b.add(Op.FULL, value=0.5, shape=(), dtype=DType.F32)
    m = b.add(Op.MUL, [x, h])
    s = b.add(Op.SUM, [m], axes=(1,), keepdim=False)
    return verify(b.build([s, m])), x


def test_printer_is_readable_and_stable() -> None:
    g, _ = _small()
    assert format_graph(g) == (
        "graph(%x: f32[2,3]) {\n"
        "  %full = full() {dtype=f32, shape=(), value=0.5} : f32[]\n"
        "  %mul = mul(%x, %full) : f32[2,3]\n"
        "  %sum = sum(%mul) {axes=(1,), keepdim=False} : f32[2]\n"
        "  return (%sum, %mul)\n"
        "}"
    )
    assert format_graph(g, canonical=True).splitlines()[2] == "  %2 = mul(%0, %1) : f32[2,3]"


def test_graph_is_immutable_and_indexes_users() -> None:
    g, x = _small()
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.outputs = ()  # type: ignore[misc]
    assert g.users(x) == ("mul",)
    assert g.users("mul") == ("sum",)
    assert [n.name for n in g.compute_nodes] == ["full", "mul", "sum"]


def test_verify_catches_broken_invariants() -> None:
    g, _ = _small()
    nodes = list(g.nodes)
    with pytest.raises(IRError, match="not defined before use"):
        verify(Graph((nodes[0], nodes[2], nodes[1], nodes[3]), g.outputs))
    with pytest.raises(IRError, match="type is"):
        bad = dataclasses.replace(nodes[2], type=TensorType((2, 3), DType.F16))
        verify(Graph((nodes[0], nodes[1], bad, nodes[3]), g.outputs))
    with pytest.raises(IRError, match="defined twice"):
        verify(Graph((*nodes, nodes[1]), g.outputs))
    with pytest.raises(IRError, match="output %nope"):
        verify(Graph(g.nodes, ("nope",)))


def test_interpreter_runs_the_reference() -> None:
    g, _ = _small()
    x = torch.randn(2, 3)
    s, m = run(g, [x])
    torch.testing.assert_close(m, x * 0.5)
    torch.testing.assert_close(s, (x * 0.5).sum(1))


def test_rng_is_counter_based_and_uniform() -> None:
    a = uniform(1234, 0, 1_000_000)
    assert torch.equal(a[:1000], uniform(1234, 0, 1000))  # a prefix does not depend on the length
    assert not torch.equal(a[:1000], uniform(1234, 1, 1000))  # streams differ
    assert not torch.equal(a[:1000], uniform(1235, 0, 1000))  # seeds differ
    assert 0.0 <= float(a.min()) and float(a.max()) < 1.0
    # mean of U[0,1) within 5 standard errors; neighbours uncorrelated
    se = (1 / 12) ** 0.5 / 1000
    assert abs(float(a.mean()) - 0.5) < 5 * se
    corr = torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1]
    assert abs(float(corr)) < 5 / 1000
