"""The prelude's vectorizable exp/erf/tanh/sigmoid against float64 torch."""

from __future__ import annotations

import ctypes

import pytest
import torch

from vfuse.codegen.cpp.gemm.prelude import render_prelude

FUNCS = {"vg_exp": torch.exp, "vg_erf": torch.erf, "vg_tanh": torch.tanh, "vg_sigmoid": torch.sigmoid}


def _source() -> str:
    loops = "".join(
        f'extern "C" void t_{f}(const float* __restrict x, float* __restrict y, long n, int) {{\n'
        f"#pragma omp simd\n  for (long i = 0; i < n; ++i) y[i] = {f}(x[i]);\n}}\n"
        for f in FUNCS
    )
    return render_prelude() + loops


@pytest.mark.parametrize("fn", list(FUNCS))
def test_vector_math_accuracy(build, fn: str) -> None:
    lib = build(_source())
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.linspace(-5, 5, 10001), torch.linspace(-1e-3, 1e-3, 101)])
    y = torch.empty_like(x)
    getattr(lib, f"t_{fn}")(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_long(x.numel()), 0)
    ref = FUNCS[fn](x.double())
    finite = ref.abs() < 1e38
    err = (y.double() - ref).abs() / ref.abs().clamp_min(1e-30)
    assert err[finite].max().item() < 4e-7
