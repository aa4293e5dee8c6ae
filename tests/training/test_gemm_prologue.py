"""A dear pointwise prologue on a MATMUL's B (fusion/forms.packed_once): computed while B is packed,
once per element, instead of stored and re-read; numerics against eager, forward and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.models.train_zoo import fix_typical_target
from torch import nn

import vfuse
from vfuse.entry.observe import compiled_graphs
from vfuse.ir import Op


def _gelu_group_labels(plan) -> list[str]:
    return [g.label for g in plan.groups if any(plan.graph[n].op is Op.GELU for n in g.nodes)]


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (lambda a, h: a.t() @ F.gelu(h), ((131, 127), (131, 113))),  # a weight gradient's form
        (lambda a, h: torch.matmul(a, F.gelu(h, approximate="tanh")), ((3, 149, 61), (3, 61, 67))),
    ],
)
def test_gelu_of_b_is_packed_and_matches_eager(fn, shapes) -> None:
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    compiled = vfuse.compile(fn, inputs)
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)
    assert _gelu_group_labels(compiled.compiled.plan) == ["gemm"]


class _Mlp(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_mlp_gradients_with_gelu_recomputed_in_the_weight_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward recomputes GELU(h) for fc2's weight gradient dY^T @ GELU(h): its B prologue.
    Save or recompute follows the target's figures, measured and load-dependent (a dram_bw of
    879 GB/s measured on this 2-core machine keeps GELU): fixed ones, as tests/training/test_remat.py."""
    fix_typical_target(monkeypatch)
    torch.manual_seed(0)
    model, x = _Mlp(131, 149), torch.randn(67, 131)  # fc2 gradient: M = 131 rows
    ref = _Mlp(131, 149)
    ref.load_state_dict(model.state_dict())
    before = compiled_graphs()  # strong references: older graphs may be collected meanwhile
    out = torch.compile(model, backend=vfuse.backend(strict=True))(x)
    out.square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        scale = q.grad.abs().max().item()
        assert (p.grad - q.grad).abs().max().item() <= 1e-4 * scale
    backward = [g for g in compiled_graphs() if all(g is not b for b in before)][1]
    assert _gelu_group_labels(backward.plan) == ["gemm"]
