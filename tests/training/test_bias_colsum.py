"""Bias gradients summed in the GEMM that makes the gradient they sum (fusion/columns.py,
schedule/colsum.py): numerics against eager on odd shapes, and the structure (the sum is the
template's column sums: no kernel re-reads dH for it; one kernel fewer than without the pass)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.entry.observe import compiled_graphs
from vfuse.fusion.rules import Rule
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel, Kernel, Load


class _Mlp(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _train(shape: tuple[int, ...], hidden: int, dynamic: bool) -> object:
    torch.manual_seed(0)
    model, x = _Mlp(shape[-1], hidden), torch.randn(*shape)
    ref = _Mlp(shape[-1], hidden)
    ref.load_state_dict(model.state_dict())
    before = compiled_graphs()  # strong references: older graphs may be collected meanwhile
    torch.compile(model, backend=vfuse.backend(strict=True), dynamic=dynamic)(x).square().mean().backward()
    ref(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        scale = q.grad.abs().max().item()
        assert (p.grad - q.grad).abs().max().item() <= 1e-4 * scale, name
    return [g for g in compiled_graphs() if all(g is not b for b in before)][1]  # the backward


def _summed_by_rows(program) -> set[str]:
    """Buffers a native (non-template) kernel reduces with a SUM."""
    out = set()
    for seg in program.segments:
        for k in seg.kernels:
            if isinstance(k, Kernel):
                loads = {s.var: s.buf for p in k.passes for s in p.body if isinstance(s, Load)}
                out |= {loads[r.arg] for p in k.passes for r in p.reduces if r.op is Op.SUM and r.arg in loads}
    return out


@pytest.mark.parametrize(("shape", "hidden"), [((2, 67, 61), 131), ((1, 31), 37), ((131, 37), 8)])
def test_bias_gradient_is_the_gemm_column_sums(shape, hidden) -> None:
    g = _train(shape, hidden, dynamic=False)
    plan = g.plan
    assert [d for d in plan.decisions if d.rule is Rule.COLUMN_SUM_EPILOGUE and d.accepted]
    program = g.executor.program
    gemms = [k for s in program.segments for k in s.kernels if isinstance(k, ContractionKernel) and k.colsum]
    assert len(gemms) == 1  # fc1's bias gradient sum(dH); fc2's sums the incoming gradient, no GEMM output
    dh = gemms[0].out
    assert dh not in _summed_by_rows(program)


def test_symbolic_sizes_keep_the_row_kernel() -> None:
    """Symbolic sizes: the template takes no column sums, the sum runs after it (same numbers)."""
    g = _train((1, 53, 29), 41, dynamic=True)
    program = g.executor.program
    assert not [k for s in program.segments for k in s.kernels if isinstance(k, ContractionKernel) and k.colsum]
    assert _summed_by_rows(program)
