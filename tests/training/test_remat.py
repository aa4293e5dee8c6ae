"""Save or recompute (entry/remat.py): the backward's saved values are chosen by vfuse's min-cut;
gradients stay eager's, a cheap pointwise value is recomputed instead of kept, and the reported
saved bytes are the bytes autograd actually holds (counted by saved-tensor hooks)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from tests.models.train_zoo import DropoutProbe, check_training_step, fix_typical_target, randomize
from tests.models.zoo import GPT2Block
from torch import nn

import vfuse
from vfuse.entry import dropout, remat
from vfuse.ir.defs import rng


@pytest.fixture(autouse=True)
def _fixed_target(monkeypatch: pytest.MonkeyPatch) -> None:
    fix_typical_target(monkeypatch)


class LnGeluMLP(nn.Module):
    def __init__(self, d: int = 24, hidden: int = 97) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.ln(x))))


def _saved(fn, x: torch.Tensor) -> list[torch.Tensor]:
    """The tensors autograd keeps for the backward of fn(x)."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x).sum().backward()
    return saved


def _activations(saved: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Saved tensors that are not graph inputs; vfuse's forward returns copies of saved inputs,
    so they are told apart by value."""
    return [t for t in saved if not any(t.shape == i.shape and torch.equal(t, i) for i in inputs)]


def test_mlp_recomputes_gelu_and_reports_saved_bytes() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = randomize(LnGeluMLP())
    x = torch.randn(3, 11, 24)
    backend = vfuse.backend(strict=True)
    check_training_step(model, (x,), 1e-4, backend)
    plan = backend.remat[-1]
    gelu = [c for c in plan.choices if c.op == "aten.gelu"]
    assert len(gelu) == 1 and not gelu[0].kept and gelu[0].recompute_s < gelu[0].keep_s, plan.text()
    assert all(not math.isinf(c.recompute_s) for c in plan.recomputed)

    compiled = torch.compile(model, backend=backend)
    saved = _saved(compiled, x)
    assert plan.saved_bytes == sum(t.numel() * t.element_size() for t in saved), plan.text()
    hidden = [t for t in saved if t.numel() == 3 * 11 * 97]
    eager_hidden = [t for t in _saved(model, x) if t.numel() == 3 * 11 * 97]
    assert len(hidden) == 1 and len(eager_hidden) == 2  # fc1's output only; eager keeps GELU's too
    activations = _activations(saved, [*model.parameters(), x])
    assert plan.activation_bytes == sum(t.numel() * t.element_size() for t in activations)


def test_gpt2_block_gradients_and_saved_bytes() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = randomize(GPT2Block(d=32, heads=4, dropout=0.0))
    x = torch.randn(2, 7, 32)
    backend = vfuse.backend(strict=True)
    logger, records = logging.getLogger("vfuse"), []
    handler, level = logging.Handler(logging.DEBUG), logger.level
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        check_training_step(model, (x,), 1e-4, backend)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert backend.stats["eager_graphs"] == 0 and len(backend.remat) == 1
    plan = backend.remat[0]
    assert plan.recomputed and plan.kept, plan.text()
    logged = [r.getMessage() for r in records if "save or recompute" in r.getMessage()]
    assert any(plan.text() in m for m in logged) and any(plan.text().splitlines()[0] in m for m in logged)
    assert plan.saved_bytes == sum(
        t.numel() * t.element_size() for t in _saved(torch.compile(model, backend=backend), x)
    )


def test_dropout_mask_recomputed_from_its_seed_not_stored() -> None:
    """Training dropout keeps an 8-byte seed, not the mask; the backward's mask is the forward's
    (w's gradient shows it), and the mask's numbers are vfuse's RAND stream for that seed."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    p, n = 0.3, 1009
    model = DropoutProbe(n, p)
    backend = vfuse.backend(strict=True)
    x = torch.ones(3, n)
    saved = _saved(torch.compile(model, backend=backend), x)
    assert [(tuple(t.shape), t.dtype) for t in saved] == [((3, n), torch.float32), ((), torch.int64)]
    plan = backend.remat[-1]
    assert plan.activation_bytes == 8 and any("never stored" in c.why and not c.kept for c in plan.choices)
    torch.manual_seed(1)
    out = torch.compile(model, backend=backend)(x)
    weight = torch.randn(out.shape)
    model.w.grad = None
    (out * weight).sum().backward()
    keep = out != 0
    assert 0.2 < 1 - keep.double().mean().item() < 0.4
    torch.testing.assert_close(model.w.grad, (keep * weight / (1 - p)).sum(0))


def test_seeded_uniform_is_vfuse_rand() -> None:
    seed = torch.tensor((5 << 40) + 123456789, dtype=torch.int64)
    got = dropout.uniform(seed, torch.Size([7, 13]))
    torch.testing.assert_close(got.flatten(), rng.uniform(int(seed), 0, 91), rtol=0, atol=0)
    got = dropout.uniform(seed, torch.Size([5]), stream=3)
    torch.testing.assert_close(got, rng.uniform(int(seed), 3, 5), rtol=0, atol=0)


def test_failed_cut_falls_back_to_torchs_partition_visibly(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(node: object) -> int:
        raise RuntimeError("no flop formula")

    monkeypatch.setattr(remat, "flops_of", broken)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = randomize(LnGeluMLP(d=8, hidden=13))
    backend = vfuse.backend(strict=True)
    with pytest.warns(UserWarning, match="save-or-recompute cut failed .*no flop formula"):
        check_training_step(model, (torch.randn(5, 8),), 1e-4, backend, steps=1)
    assert not backend.remat and backend.stats["eager_graphs"] == 0


def test_dropout_after_gelu_keeps_one_hidden_tensor_and_the_seed() -> None:
    """fc2(dropout(gelu(fc1(x)))): the backward recomputes GELU, the mask and their product from
    fc1's output and the seed: one hidden-size float tensor and 8 bytes are all it keeps."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(16, 61), nn.GELU(), nn.Dropout(0.25), nn.Linear(61, 16))
    backend = vfuse.backend(strict=True)
    x = torch.randn(9, 16)
    saved = _saved(torch.compile(model, backend=backend), x)
    activations = _activations(saved, [*model.parameters(), x])
    assert sorted((tuple(t.shape), t.dtype) for t in activations) == [((), torch.int64), ((9, 61), torch.float32)]
    assert backend.remat[-1].activation_bytes == 8 + 9 * 61 * 4
    assert backend.stats["saved_bytes"] == sum(t.numel() * t.element_size() for t in saved)
