"""The GEMM epilogue's tanh and tanh-form GELU (gemm/prelude.py vg_tanh / vg_gelu_tanh, the row
kernels' exp-based forms) over a dense sweep of floats against float64 torch, vectorized as an
epilogue runs them (`omp simd`) and scalar, with the special values; and the form is the cheap
one: its loop makes no calls and has one division per vector."""

from __future__ import annotations

import ctypes
import math
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.prelude import render_prelude


def _source() -> str:
    loops = "".join(
        f'extern "C" {attr}void {name}_{kind}(const float* __restrict x, float* __restrict y, long n) {{\n'
        f"{pragma}  for (long i = 0; i < n; ++i) {{ float v = x[i]; {stmt} y[i] = v; }}\n}}\n"
        for name, stmt in (("tanh", "v = vg_tanh(v);"), ("gelu", E.bias_gelu_tanh().body[1]))
        for kind, attr, pragma in (
            ("simd", "", "#pragma omp simd\n"),
            ("scalar", '__attribute__((optimize("no-tree-vectorize"))) ', ""),
        )
    )
    return render_prelude() + loops


def _sweep() -> torch.Tensor:
    """Every 401st float32 bit pattern of [-20, 20] (~5.5M values: both signs, every binade from the
    subnormals up), plus the edges."""
    top = int(torch.tensor(20.0).view(torch.int32))
    pos = torch.arange(0, top, 401, dtype=torch.int32).view(torch.float32)
    edges = torch.tensor([0.0, 1e-30, 1e-7, 0.17, 9.0, 9.1, 9.2, 30.0, 88.0, 89.0, 1e30, 3.4e38])
    x = torch.cat([pos, edges])
    return torch.cat([x, -x])


def _run(lib: ctypes.CDLL, fn: str, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    getattr(lib, fn)(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_long(x.numel()))
    return y


def _ulps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units of the float32 spacing at ref (subnormal spacing at least)."""
    spacing = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs().float()).exponent.double() - 24)
    return (got.double() - ref).abs() / spacing.clamp_min(2.0**-149)


@pytest.mark.parametrize("kind", ["simd", "scalar"])
def test_tanh_dense_sweep(build, kind: str) -> None:
    lib = build(_source())
    x = _sweep()
    got = _run(lib, f"tanh_{kind}", x)
    ulps = _ulps(got, torch.tanh(x.double()))
    assert ulps.max().item() <= 3.0, x[ulps.argmax()].item()
    assert torch.equal(got[x == 0].view(torch.int32), x[x == 0].view(torch.int32))  # tanh(-0) = -0
    special = _run(lib, f"tanh_{kind}", torch.tensor([math.inf, -math.inf, math.nan]))
    assert special[:2].tolist() == [1.0, -1.0] and math.isnan(special[2].item())


@pytest.mark.parametrize("kind", ["simd", "scalar"])
def test_gelu_tanh_dense_sweep(build, kind: str) -> None:
    lib = build(_source())
    x = _sweep()
    got = _run(lib, f"gelu_{kind}", x)
    # float64 as x sigmoid(2u): its 0.5 x (1 + tanh(u)) cancels in float64 too for x below -6.
    xd = x.double()
    ref = xd / (1.0 + torch.exp(-xd * (1.5957691216057308 + 0.0713548162726 * xd * xd)))
    # The rounding of 2u is amplified by up to |2u| where the result is tiny: an absolute part,
    # the row kernels' budget (tests/codegen/test_vector_math.py); a few ulp where |x| < 1.
    err = (got.double() - ref).abs()
    assert bool((err <= 1e-7 + 1e-6 * ref.abs()).all()), x[err > 1e-7 + 1e-6 * ref.abs()][:5].tolist()
    moderate = (x.abs() < 1) & (x.abs() > 1e-30)
    assert _ulps(got[moderate], ref[moderate]).max().item() <= 3.0
    # Against eager float32 the epilogue stays within its documented tolerance everywhere.
    eager = F.gelu(x, approximate="tanh")
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-6)
    special = _run(lib, f"gelu_{kind}", torch.tensor([math.inf, -math.inf, math.nan, -0.0]))
    assert special[0].item() == math.inf and math.isnan(special[1].item()) and math.isnan(special[2].item())
    assert special[3].item() == 0.0


def test_cheap_form_vectorized_without_calls(build, tmp_path) -> None:
    """The simd loops compile to vector code with no call (libm's tanhf) and one division per
    vector (the old rational form had one too, but 16 more operations: counted in the loop)."""
    cpp = tmp_path / "t.cpp"
    cpp.write_text(_source())
    asm = subprocess.run(
        ["g++", "-std=c++17", "-O3", "-march=native", "-fopenmp", "-S", "-o", "-", str(cpp)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for fn in ("tanh_simd", "gelu_simd"):
        body = re.search(rf"^{fn}:\n(.*?)\.cfi_endproc", asm, re.S | re.M)
        assert body is not None, fn
        text = body.group(1)
        assert "call" not in text, fn
        assert re.search(r"\bv?div[ps]s\b", text), fn
