"""Real models compiled with backend="vfuse" give eager's outputs (inference and training)."""

from __future__ import annotations

import pytest
import torch
from tests.models.zoo import MLP, BasicBlock, GPT2Block, SdpaBlock, randomize_bn_stats

import vfuse

CASES = [
    ("gpt2_block", lambda: GPT2Block(), lambda: torch.randn(2, 16, 64)),
    ("sdpa_gqa_block", lambda: SdpaBlock(), lambda: torch.randn(2, 16, 64)),
    ("resnet_basic_block", lambda: randomize_bn_stats(BasicBlock()), lambda: torch.randn(2, 8, 16, 16)),
    ("mlp", lambda: MLP(), lambda: torch.randn(8, 32)),
]


@pytest.mark.parametrize(("name", "make", "data"), CASES, ids=[c[0] for c in CASES])
def test_inference_matches_eager(name: str, make, data) -> None:
    torch.manual_seed(0)
    model, x = make().eval(), data()
    backend = vfuse.backend(strict=True)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert backend.stats["graphs"] >= 1 and backend.stats["eager_graphs"] == 0
    assert backend.stats["fallbacks"] == {}, f"{name} fell back to torch for {backend.stats['fallbacks']}"


def test_training_step_matches_eager_gradients() -> None:
    """Forward and backward graphs both go through vfuse; dropout off so results are comparable."""
    torch.manual_seed(0)
    model = randomize_bn_stats(BasicBlock()).train()
    ref = randomize_bn_stats(BasicBlock()).train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 16, 16)
    backend = vfuse.backend(strict=True)
    torch.compile(model, backend=backend)(x).square().mean().backward()
    ref(x).square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"gradient of {n}")
    torch.testing.assert_close(model.bn1.running_mean, ref.bn1.running_mean)
    assert backend.stats["graphs"] == 2  # forward and backward


def test_aot_compile_matches_eager() -> None:
    torch.manual_seed(0)
    model, x = GPT2Block().eval(), torch.randn(2, 16, 64)
    compiled = vfuse.compile(model, (x,), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_freeze_folds_batchnorm_into_convolutions() -> None:
    """freeze=True compiles parameters in as constants; every BN then folds into its conv."""
    from vfuse.ir import Op

    torch.manual_seed(0)
    model, x = randomize_bn_stats(BasicBlock()).eval(), torch.randn(2, 8, 16, 16)
    backend = vfuse.backend(strict=True, freeze=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
        aot = vfuse.compile(model, (x,), strict=True, freeze=True)
        torch.testing.assert_close(aot(x), model(x), rtol=1e-4, atol=1e-5)
    for graph in (backend.compiled[0].graph, aot.graph):
        ops = [n.op for n in graph.compute_nodes]
        assert ops.count(Op.CONV2D) == 3 and Op.RSQRT not in ops and len(graph.inputs) == 1
