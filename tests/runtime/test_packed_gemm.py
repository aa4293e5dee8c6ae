"""A torch step's GEMM with a constant weight runs torch's packed-weight sgemm (`schedule/packed.py`,
`runtime/steps.StepRunner._packed_gemm`): the weight packed once, the numerics torch's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vfuse
from vfuse.ir import ConstValue, GraphBuilder, Op, TensorType, verify
from vfuse.ir.types import DType
from vfuse.runtime import steps
from vfuse.schedule import TorchStep
from vfuse.schedule.packed import packed_gemms


def _graph(m: int, weight: bool) -> object:
    b = GraphBuilder()
    a = b.add(Op.INPUT, name="a", index=0, type=TensorType((m, 64), DType.F32))
    if weight:
        w = b.add(Op.CONSTANT, name="w", value=ConstValue(torch.randn(32, 64)))
        w = b.add(Op.PERMUTE, (w,), name="t", perm=(1, 0))
    else:
        w = b.add(Op.INPUT, name="w", index=1, type=TensorType((64, 32), DType.F32))
    return verify(b.build([b.add(Op.MATMUL, (a, w), name="mm")]))


def test_only_constant_weights_of_static_fp32_gemms_are_packed() -> None:
    assert packed_gemms(_graph(48, True), ["t", "mm"]) == ("mm",)
    assert packed_gemms(_graph(48, False), ["mm"]) == ()  # an activation: nothing to pack once


def _runner() -> steps.StepRunner:
    return steps.StepRunner()


@pytest.mark.skipif(not steps.MKL_PACKED, reason="torch without MKL (aarch64 builds): the plain GEMM runs")
def test_the_weight_is_packed_once_and_other_row_counts_take_the_plain_gemm() -> None:
    torch.manual_seed(0)
    r, a, b = _runner(), torch.randn(48, 64), torch.randn(64, 32)
    for _ in range(2):
        torch.testing.assert_close(r._packed_gemm("mm", a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert list(r._packs) == ["mm"]  # type: ignore[attr-defined]
    assert r._packed_gemm("mm", torch.randn(47, 64), b) is None  # packed for 48 rows


def _frozen_mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
    return m, torch.randn(2, 131, 256)  # 262 rows: not whole register tiles


def _torch_at_twice_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's target as if its torch ran at twice the tier's width: the GEMMs go to torch."""
    import vfuse.targets.cpu as cpu

    real = cpu.cpu_target
    monkeypatch.setattr(cpu, "cpu_target", lambda *a, **k: dataclasses.replace(real(*a, **k), library_gain=2.0))


@pytest.mark.parametrize("mkl", [True, False])
def test_a_frozen_linear_in_torch_matches_eager_over_calls(mkl: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "MKL_PACKED", steps.MKL_PACKED and mkl)
    _torch_at_twice_the_width(monkeypatch)
    model, x = _frozen_mlp()
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    executor = compiled.compiled.executor
    packed = [n for s in executor.program.steps if isinstance(s, TorchStep) for n in s.packed]
    assert len(packed) == 2, "both GEMMs run in torch with their weights packed"
    assert sorted(getattr(executor, "_packs", {})) == (sorted(packed) if steps.MKL_PACKED else [])


def test_a_changed_input_with_the_same_weight_is_recomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack holds the weight only: every call multiplies the call's own A."""
    _torch_at_twice_the_width(monkeypatch)
    model, x = _frozen_mlp()
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True)
        compiled(x)
        x2 = torch.randn_like(x)
        torch.testing.assert_close(compiled(x2), model(x2), rtol=1e-4, atol=1e-5)
