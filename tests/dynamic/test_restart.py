"""Dynamo's float restart asked for before AOTAutograd traces (entry/restart.py).

Each test compiles a fresh backend after `torch._dynamo.reset()` with the graph cache off (a cold
process as far as tracing goes), counts AOTAutograd's traces, records the floats marked for
specialization, and checks outputs against eager at several sizes. The baseline is the same
compile with the prediction turned off (`restart.certain` returning nothing): AOTAutograd's pass
then asks for the restart after its first trace.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo.backends.common as aot_common
import torch.nn.functional as F
from torch._dynamo.symbolic_convert import TensorifyState

import vfuse
from vfuse.entry import restart


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """AOTAutograd's traces and every float Dynamo was told to specialize, by anyone."""
    seen: dict[str, list[Any]] = {"traces": [], "floats": []}
    real_aot, real_specialize = aot_common.aot_module_simplified, TensorifyState.specialize

    def traced(*args: Any, **kwargs: Any) -> Any:
        seen["traces"].append(1)
        return real_aot(*args, **kwargs)

    def specialize(name: str) -> None:
        seen["floats"].append(name)
        real_specialize(name)

    monkeypatch.setattr(aot_common, "aot_module_simplified", traced)
    monkeypatch.setattr(TensorifyState, "specialize", staticmethod(specialize))
    monkeypatch.setenv("VFUSE_GRAPH_CACHE", "0")
    torch._dynamo.reset()
    yield seen
    torch._dynamo.reset()


class _Layer(torch.nn.Module):
    """Float attributes that end as `double` arguments of ATen ops: all specialized by the pass."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, d)
        self.ln = torch.nn.LayerNorm(d, eps=1e-6)
        self.drop = torch.nn.Dropout(0.1)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.heads, self.scale = heads, 0.3

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.ln(self.emb(tokens)))
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, scale=self.scale, is_causal=True)
        return y.transpose(1, 2).reshape(b, n, d) + x


class _Arithmetic(_Layer):
    """Also a float the pass turns into a tensor (an attribute scaling a tensor): left to the pass,
    it stays an input of the graph, so changing it compiles nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = 0.7

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = super().forward(tokens)
        return x * self.alpha + x


def _compile(module: torch.nn.Module) -> tuple[Callable, Any]:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    return torch.compile(module, backend=backend, dynamic=True), backend


def _run(module: torch.nn.Module, lengths: tuple[int, ...] = (7, 13, 2, 31)) -> tuple[Callable, Any]:
    fn, backend = _compile(module)
    with torch.no_grad():
        for n in lengths:
            tokens = torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(fn(tokens), module(tokens), rtol=1e-4, atol=1e-5)
    assert backend.stats["eager_graphs"] == 0
    return fn, backend


@pytest.mark.parametrize("model", [_Layer, _Arithmetic])
def test_restart_before_the_trace_specializes_what_the_pass_would(
    model: type[_Layer], record: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = model().eval()
    with monkeypatch.context() as m:  # the pass's own restart, after its trace
        m.setattr(restart, "certain", lambda gm, inputs: [])
        _run(module)
    traces, floats = len(record["traces"]), sorted(record["floats"])
    assert traces == 2 and len(floats) == 4  # norm_type, eps, p, scale
    record["traces"].clear()
    record["floats"].clear()
    fn, backend = _run(module)
    assert len(record["traces"]) == 1  # AOTAutograd traced once: the restart came before it
    assert sorted(record["floats"]) == floats  # the same floats, the pass's tensor left as one
    assert backend.stats["graphs"] == 1
    if isinstance(module, _Arithmetic):
        module.alpha = 0.9  # an input of the graph, not a constant guarded on
        tokens = torch.randint(0, 50, (2, 9))
        with torch.no_grad():
            torch.testing.assert_close(fn(tokens), module(tokens), rtol=1e-4, atol=1e-5)
        assert backend.stats["graphs"] == 1 and len(record["traces"]) == 1


def _checks(gm: torch.fx.GraphModule) -> dict[str, bool]:
    """What `restart` decides of Dynamo's graph, and of it with a use changed (on a copy)."""
    items = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "item"]
    out = {"items": len(items) == 4, "all": all(restart._specialized_by_pass(n) for n in items)}
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    drop = next(n for n in gm.graph.nodes if n.target is F.dropout)
    drop.args = (*drop.args[:2], True, *drop.args[3:])  # a training dropout's p is arithmetic
    out["training dropout"] = restart._specialized_by_pass(drop.args[1])
    ln = next(n for n in gm.graph.nodes if n.target is F.layer_norm)
    ln.args = (*ln.args[:4], ln.args[4], ln.args[4])  # also passed as another argument
    out["eps twice"] = restart._opaque_use(ln, ln.args[4])
    return out


def test_uses_the_pass_can_make_tensors_are_not_predicted(record: dict[str, list[Any]]) -> None:
    seen: list[dict[str, bool]] = []

    def check(gm: torch.fx.GraphModule, inputs: Any) -> list[str]:
        if not seen:  # the first trace's graph, now: Dynamo empties it when its analysis restarts
            seen.append(_checks(gm))
        return []

    with pytest.MonkeyPatch.context() as m:
        m.setattr(restart, "certain", check)
        _run(_Layer().eval(), (5,))
    assert seen[0] == {"items": True, "all": True, "training dropout": False, "eps twice": False}
