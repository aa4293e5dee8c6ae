"""When Dynamo makes the sizes symbolic (B=8, then 16: symbolic, then 8 again) the symbolic graph
is compiled once over its symbols and serves every size, the first one included (entry/dynamic.py);
a graph that differs in anything but sizes is compiled again. `match` (entry/specialize.py) is
what a graph the symbolic path cannot take uses to reuse a fixed-shape graph."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse
from vfuse.entry.specialize import match


class Heads(torch.nn.Module):
    """Sizes flow into views: the symbolic graph does size arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.lin(x).view(b, t, 3, c // 3)
        return torch.softmax(h, -1).reshape(b * t, c) + 1


def test_seen_shape_reuses_its_graph_in_inference() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend, m = vfuse.backend(), Heads()
    c = torch.compile(m, backend=backend)
    counts = []
    with torch.no_grad():
        for b in (2, 5, 2, 5):
            x = torch.randn(b, 7, 12)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
            counts.append(backend.stats["graphs"])
    assert counts == [1, 2, 2, 2]  # B=5 compiled over its symbols; B=2 again runs that program


def test_seen_shape_reuses_forward_and_backward() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend, m = vfuse.backend(), Heads()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=backend)
    counts = []
    for b in (3, 5, 3):
        x = torch.randn(b, 7, 12)
        c(x).square().sum().backward()
        ref(x).square().sum().backward()
        torch.testing.assert_close(m.lin.weight.grad, ref.lin.weight.grad, rtol=1e-4, atol=1e-5)
        m.zero_grad()
        ref.zero_grad()
        counts.append(backend.stats["graphs"])
    assert counts == [2, 4, 4]  # B=5: forward and backward over their symbols, serving B=3 too


def test_string_backend_reuses_seen_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    import vfuse.entry.capture as capture

    compiled: list[object] = []
    compile_fx = capture.compile_fx
    monkeypatch.setattr(capture, "compile_fx", lambda *a, **k: compiled.append(a) or compile_fx(*a, **k))
    torch._dynamo.reset()
    m = Heads()
    c = torch.compile(m, backend="vfuse")  # a new backend object per graph: the reuse is shared
    with torch.no_grad():
        for b in (4, 3, 4, 9):
            x = torch.randn(b, 2, 12)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert len(compiled) == 2  # B=4 fixed; B=3 over its symbols, which B=4 and B=9 then take


def test_frozen_parameters_are_reused_only_with_their_module() -> None:
    """With freeze, parameters are compiled in: another module's graph of the same shapes
    must not be reused for this one."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m1, m2 = Heads(), Heads()
    backend = vfuse.backend(freeze=True)
    c1, c2 = torch.compile(m1, backend=backend), torch.compile(m2, backend=backend)
    with torch.no_grad():
        for c, m, b in ((c1, m1, 2), (c2, m2, 5), (c2, m2, 2)):
            x = torch.randn(b, 7, 12)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)


SCALE = 2.0


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * SCALE


def test_graph_differing_in_a_constant_is_compiled() -> None:
    global SCALE
    torch._dynamo.reset()
    backend = vfuse.backend()
    c = torch.compile(_scaled, backend=backend)
    try:
        with torch.no_grad():
            for b, SCALE in ((8, 2.0), (16, 2.0), (8, 3.0)):  # the loop sets the global _scaled reads
                x = torch.randn(b, 4)
                torch.testing.assert_close(c(x), torch.tanh(x) * SCALE)
    finally:
        SCALE = 2.0
    assert backend.stats["graphs"] == 3 and backend.stats["reused_graphs"] == 0


def test_match_evaluates_sizes_and_compares_everything_else() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(x.shape[0] * 2, -1) * 3).sum(1)

    x = torch.randn(4, 6)
    symbolic = make_fx(f, tracing_mode="symbolic")(x)
    assert any(n.target == torch.ops.aten.sym_size.int for n in symbolic.graph.nodes)
    assert match(symbolic, [x], make_fx(f)(x)) == {}
    assert match(symbolic, [x], make_fx(lambda x: (x.reshape(8, -1) * 3).sum(1))(x)) == {}
    assert match(symbolic, [x], make_fx(lambda x: (x.reshape(4, -1) * 3).sum(1))(x)) is None
    assert match(symbolic, [x], make_fx(lambda x: (x.reshape(8, -1) * 2).sum(1))(x)) is None
    assert match(symbolic, [x], make_fx(lambda x: (x.reshape(8, -1) * 3).sum(0))(x)) is None
