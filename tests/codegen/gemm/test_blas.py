"""The OpenBLAS-per-tile alternative (needs the optional scipy-openblas32 package)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import GemmSpec, blas
from vfuse.codegen.cpp.gemm import epilogues as E

pytest.importorskip("scipy_openblas32")  # a dev extra; without it only this variant is untested


@pytest.mark.parametrize("trans_b", [False, True])
def test_blas_tiles_match_torch(build, call, trans_b: bool) -> None:
    spec = GemmSpec(f"blas_{int(trans_b)}", 70, 90, 33, trans_b=trans_b)
    lib = build(blas.render_gemm_blas(spec, E.bias_gelu_tanh(), tm=32, tn=48), tuple(blas.blas_link_flags()))
    a, bias = torch.randn(70, 33) / 6, torch.randn(90)
    w = torch.randn(90, 33) if trans_b else torch.randn(33, 90)
    out = torch.empty(70, 90)
    call(lib, spec.name, a, w, out, bias)
    y = a @ (w.T if trans_b else w) + bias
    torch.testing.assert_close(out, F.gelu(y, approximate="tanh"), rtol=1e-4, atol=1e-4)
