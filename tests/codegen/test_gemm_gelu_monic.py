"""The GEMM epilogue's erf-GELU (`gemm/epilogue.bias_gelu_erf`, `vg_gelu_erf` in the GEMM prelude)
in the row kernels' form with P monic (session 17's vf_gelu_none): 14 FMA-pipe operations per vector
where vg_erf's form took 15, and more accurate; tiers without an fma keep vg_erf's form bit for bit.
The accuracy checks run every float of the regions where the bounds bind, through a GEMM by the
identity (C = A exactly); the old form fails the first (9.2e-5 relative in [-3, -1)).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.gemm.conftest import FLAGS, _compile

from vfuse.codegen.cpp.gemm import Epilogue, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.schedule.microtile import VectorUnit
from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa

OLD = "v = 0.5f * v * (1.0f + vg_erf(v * 0.70710678118654752f));"  # vg_erf's form, before
WIDTH = 16


def _old() -> Epilogue:
    return Epilogue("old_gelu", E.bias().args, ("v += bias[j];", OLD))


def _gelu_by_identity(
    x: torch.Tensor, epi: Epilogue, flags: tuple[str, ...], tmp: Path, unit: VectorUnit, width: int = WIDTH
) -> torch.Tensor:
    """x through a (len/width) x width @ I GEMM with the epilogue and a zero bias: the epilogue of x
    (width 1 for infinities: inf * 0 in a sum is NaN)."""
    pad = -x.numel() % width
    a = torch.cat([x, torch.zeros(pad)]).view(-1, width).contiguous()
    spec = GemmSpec(f"gelu_{epi.name}_{width}", a.shape[0], width, width, unit=unit)
    lib = _compile(render_gemm(spec, epi), FLAGS + flags, tmp)
    out = torch.empty_like(a)
    args = (a, torch.eye(width), out, torch.zeros(width))
    getattr(lib, spec.name)(*(ctypes.c_void_p(t.data_ptr()) for t in args), ctypes.c_int(2))
    return out.view(-1)[: x.numel()]


def _floats(lo: float, hi: float) -> torch.Tensor:
    """Every float in [lo, hi) (0 <= lo < hi)."""
    a, b = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (lo, hi))
    return torch.arange(a, b, dtype=torch.int32).view(torch.float32)


def _ref(x: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return 0.5 * xd * torch.erfc(-xd / 2**0.5)


FMA = pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="the bounds are the fma form's")


@FMA
def test_relative_error_where_it_cancels(tmp_path: Path) -> None:
    # x/2 + |x| e cancels for x in [-3, -1): every float there (the old form: 9.16e-5).
    x = -_floats(1.0, 3.0)
    got = _gelu_by_identity(x, E.bias_gelu_erf(), (), tmp_path, VectorUnit(8, 16)).double()
    assert ((got - _ref(x)).abs() / _ref(x).abs()).max() < 8.6e-5


@FMA
def test_absolute_error_near_the_clamp(tmp_path: Path) -> None:
    mags = _floats(5.0, 5.3)
    x = torch.cat([mags, -mags])
    got = _gelu_by_identity(x, E.bias_gelu_erf(), (), tmp_path, VectorUnit(8, 16)).double()
    assert (got - _ref(x)).abs().max() < 1.1e-6


@FMA
def test_specials(tmp_path: Path) -> None:
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, 1e30, -1e30, 5.6, -5.6, 20.0, -20.0])
    got = _gelu_by_identity(x, E.bias_gelu_erf(), (), tmp_path, VectorUnit(8, 16), width=1)
    # gelu(-inf) = NaN as eager's; below -5.6, +0 where eager gives -0 (vf_gelu_none's choice)
    want = torch.tensor([float("inf"), float("nan"), float("nan"), 0.0, 1e30, 0.0, 5.6, 0.0, 20.0, 0.0])
    torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)


def test_without_fma_the_old_form_bit_for_bit(tmp_path: Path) -> None:
    """x86-64 (SSE2, no fma): vg_gelu_erf is vg_erf's form, every bit (every 257th float of |x| < 20)."""
    mags = _floats(0.0, 20.0)[::257]
    x = torch.cat([mags, -mags])
    unit, flags = VectorUnit(4, 16), ("-march=x86-64",)
    new = _gelu_by_identity(x, E.bias_gelu_erf(), flags, tmp_path, unit)
    old = _gelu_by_identity(x, _old(), flags, tmp_path, unit)
    assert torch.equal(new.view(torch.int32), old.view(torch.int32))


@pytest.mark.parametrize("m,n,k", [(67, 45, 130), (1, 1, 1), (97, 31, 13)])
def test_linear_gelu_matches_eager(tmp_path: Path, m: int, n: int, k: int) -> None:
    """x @ W^T + b then erf-GELU against F.gelu(F.linear(...)) within the row kernels' budget."""
    torch.manual_seed(m * n + k)
    x, w, b = torch.randn(m, k) / k**0.5, torch.randn(n, k) * 2, torch.randn(n)
    spec = GemmSpec(f"lin_gelu_{m}_{n}_{k}", m, n, k, trans_b=True)
    lib = _compile(render_gemm(spec, E.bias_gelu_erf()), FLAGS, tmp_path)
    out = torch.empty(m, n)
    getattr(lib, spec.name)(*(ctypes.c_void_p(t.data_ptr()) for t in (x, w, out, b)), ctypes.c_int(2))
    ref = F.gelu(F.linear(x.double(), w.double(), b.double()))
    assert ((out.double() - ref).abs() / (2e-6 + 1e-5 * ref.abs())).max() < 1.0
