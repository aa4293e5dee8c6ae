"""g++ 12 miscompiles AVX2 gathers it makes of clamped-index loads under `#pragma omp simd` when
tuned for Zen 3 or Haswell: one kernel of a 7x7 conv data gradient, a shifted tap plane (a
concatenation with zero rows and columns), read zeros for in-range elements.
The toolchain turns g++'s gathers off (`toolchain.gcc_workarounds`). Reproduced on a Zen 3 (g++ 12.2,
-march=x86-64-v3 -mtune=native); a standalone copy of the kernel compiled alone did not fail, so the test
runs the whole graph. The col2im form that exposed it (tap planes spread over the whole grid, later summed per
stride phase, d7633b3) no longer reaches that code: re-checked in session 9, this graph, the same planes built
from torch.cat with zeros and the fuzzer's shifted-plane motif (tests/fuzz/graphs_motifs.shifted_planes) all
compute right without the flag. So the end-to-end test now checks the 7x7 GEMM form's numerics, and the
version test checks that the flag is applied."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.codegen.cpp.toolchain import NO_GATHERS, gcc_workarounds
from vfuse.frontend import lower_conv_backward
from vfuse.targets.isa import ARM, X86, CpuIsa, Isa

aten = torch.ops.aten


def _grad_input(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return aten.convolution_backward(go, x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [True, False, False])[0]


def test_7x7_strided_data_gradient_as_gemm_and_col2im(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph that exposed it: a 7x7 stride-2 conv's data gradient in the GEMM form (49 tap
    planes, past the form's default cap), whose split col2im kernels read zeros without the workaround."""
    monkeypatch.setattr(lower_conv_backward, "MAX_GEMM_TAPS", 49)
    torch.manual_seed(0)
    x, w = torch.randn(1, 3, 16, 16), torch.randn(7, 3, 7, 7)
    go = torch.randn_like(F.conv2d(x, w, None, 2, 3))
    got = vfuse.compile(_grad_input, (go, x, w), strict=True)(go, x, w)
    torch.testing.assert_close(got, _grad_input(go, x, w), rtol=1e-4, atol=1e-4)


def test_workaround_only_for_gcc_12_and_later_on_x86() -> None:
    avx2, arm = CpuIsa(Isa.AVX2, frozenset(), X86), CpuIsa(Isa.NEON, frozenset(), ARM)
    assert gcc_workarounds("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", avx2) == (NO_GATHERS,)
    assert gcc_workarounds("g++ (GCC) 14.1.1 20240720", avx2) == (NO_GATHERS,)
    assert gcc_workarounds("g++ (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", avx2) == ()
    assert gcc_workarounds("Debian clang version 14.0.6", avx2) == ()
    assert gcc_workarounds("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", arm) == ()
