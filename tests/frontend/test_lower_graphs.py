"""Whole graphs as torch produces them: aot_autograd forward and backward graphs of small
models, and torch.export graphs. The lowered IR must match torch running the same FX graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from tests.frontend.lowering_helpers import assert_matches, fallbacks
from torch._functorch.aot_autograd import aot_module

from vfuse.context import Context
from vfuse.entry.outputs import with_none_outputs, without_none_outputs
from vfuse.frontend.decompositions import decomposition_table
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Op, verify


class Block(nn.Module):
    """A pre-norm transformer block with a GELU MLP, plus a conv-bn-relu stem."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 16))

    def forward(self, img: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stem = F.relu(self.bn(self.conv(img))).mean((2, 3))
        q, k, v = self.qkv(self.ln(x)).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 5, 16)
        x = x + att
        x = x + F.dropout(self.mlp(F.rms_norm(x, (16,))), 0.0, self.training)
        return x.softmax(-1), stem


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(2, 3, 6, 6, generator=g), torch.randn(2, 5, 16, generator=g)


def _capture(model: nn.Module, inputs: tuple[torch.Tensor, ...], backward: bool) -> list[tuple[Any, list]]:
    """(FX graph, the real inputs torch ran it on) for every graph aot_autograd compiled."""
    seen: list[tuple[Any, list]] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        def call(*args: Any) -> Any:
            seen.append((gm, [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]))
            return gm(*args)

        call._boxed_call = False  # type: ignore[attr-defined]
        return call

    compiled = aot_module(model, fw_compiler=compiler, bw_compiler=compiler, decompositions=decomposition_table())
    outs = compiled(*inputs)
    if backward:
        sum(o.sum() for o in outs).backward()
    return seen


def test_aot_inference_graph_lowers_completely() -> None:
    model = Block().eval()
    with torch.no_grad():
        ((gm, args),) = _capture(model, _inputs(), backward=False)
    graph = verify(lower(gm, Context()))
    assert not fallbacks(graph), fallbacks(graph)
    assert_matches(run(graph, args), gm(*args), rtol=1e-4, atol=1e-5)


# In training nothing runs through torch: attention's forward with its logsumexp and its backward
# are SDPA_LSE, SDPA_BACKWARD; convolution_backward is forward CONV2Ds (lower_conv_backward.py).
TRAINING_FALLBACKS: set[str] = set()


def test_aot_training_forward_and_backward_graphs_match_torch() -> None:
    model = Block().train()
    inputs = tuple(t.requires_grad_() for t in _inputs())
    graphs = _capture(model, inputs, backward=True)
    assert len(graphs) == 2
    for gm, args in graphs:
        # The backward graph returns None for the BatchNorm running stats (they need no grad).
        tensors_only, present = without_none_outputs(gm)
        graph = verify(lower(tensors_only, Context()))
        assert set(fallbacks(graph)) <= TRAINING_FALLBACKS, fallbacks(graph)
        got = with_none_outputs(run(graph, args), present)
        want = gm(*args)
        assert [g is None for g in got] == [w is None for w in want]
        assert_matches([g for g in got if g is not None], want, rtol=1e-4, atol=1e-5)


def test_export_graph_matches_torch() -> None:
    model = Block().eval()
    program = torch.export.export(model, _inputs()).run_decompositions(decomposition_table())
    graph = verify(lower(program.graph_module, Context()))
    assert not fallbacks(graph), fallbacks(graph)
    sig = program.graph_signature
    lifted = {**program.state_dict, **program.constants}
    user = iter(_inputs())
    args = [lifted[s.target] if s.target in lifted else next(user) for s in sig.input_specs]
    assert_matches(run(graph, args), model(*_inputs()), rtol=1e-4, atol=1e-5)


def test_torch_compile_backend_lowers_without_fallbacks() -> None:
    """End to end through Dynamo and the vfuse backend: nothing of the block runs through torch."""
    import vfuse

    model = Block().eval()
    backend = vfuse.backend(backend="interp", strict=True)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        got, want = compiled(*_inputs()), model(*_inputs())
    assert backend.compiled and not backend.stats["fallbacks"], backend.stats
    assert_matches(list(got), want, rtol=1e-4, atol=1e-5)


class Activations(nn.Module):
    """Every activation whose backward torch decomposes for vfuse, plus dropout and log_softmax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = [F.silu, torch.sigmoid, torch.tanh, F.hardtanh, F.leaky_relu, F.elu, F.hardswish, F.mish, F.relu,
                F.softplus, F.hardsigmoid, F.gelu, lambda t: F.log_softmax(t, -1),
                lambda t: F.dropout(t, 0.2)]  # fmt: skip
        y = sum(f(x * (i + 1) / 4) for i, f in enumerate(acts))
        losses = F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(-x)) + F.mse_loss(x, y) + F.huber_loss(x, y)
        return y.pow(2).sum(-1) + losses + F.glu(x[:, :8]).sum() + F.logsigmoid(x).sum()


def test_activation_backward_graphs_lower_completely() -> None:
    model = Activations().train()
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(2)).requires_grad_()
    graphs = _capture(model, (x,), backward=True)
    assert len(graphs) == 2
    compared = 0
    for gm, args in graphs:
        graph = verify(lower(gm, Context()))
        assert not fallbacks(graph), fallbacks(graph)
        # The forward draws its dropout mask from vfuse's RNG, not torch's, so only the backward
        # graph (which receives the mask as an input) can be compared number for number.
        if not any(n.op is Op.RAND for n in graph.nodes):
            assert_matches(run(graph, args), gm(*args), rtol=1e-4, atol=1e-5)
            compared += 1
    assert compared == 1
