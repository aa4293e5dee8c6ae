"""On AArch64 (which always has fused multiply-add, `__ARM_FEATURE_FMA`) vf_fmaf / vg_fmaf are real
fmas, so the erf-GELUs take the fma form there too: the row kernels' vf_gelu_none and the GEMM
epilogue's vg_gelu_erf give every bit an x86-64-v3 build gives (cross-compiled, run under qemu).
Before, both rounded a * b and the add apart on ARM64."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from tests.aarch64.cross import CXX, FLAGS, QEMU, SYSROOT, missing_tools

from vfuse.codegen.cpp.gemm.prelude import _MATH
from vfuse.codegen.cpp.prelude import PRELUDE

pytestmark = [pytest.mark.aarch64, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]

PROGRAM = r"""
#include <cstdio>
#include <cstring>
int main() {
  // fma(1 + 2^-23, 1 - 2^-23, -1) = -2^-46 exactly; unfused, the product rounds to 1 and the sum is 0.
  const volatile float a = 1.0f + 0x1p-23f, b = 1.0f - 0x1p-23f, c = -1.0f;
  float out[3] = {vf_fmaf(a, b, c), vg_fmaf(a, b, c), 0.0f};
  std::fwrite(out, sizeof(float), 2, stdout);
  float x;
  while (std::fread(&x, sizeof(float), 1, stdin) == 1) {
    const float y[2] = {vf_gelu_none(x), vg_gelu_erf(x)};
    std::fwrite(y, sizeof(float), 2, stdout);
  }
}
"""


def _source() -> str:
    return f"{PRELUDE}\n#include <cstdint>\n{_MATH}\n{PROGRAM}"


def _run(cmd: list[str], x: torch.Tensor) -> torch.Tensor:
    res = subprocess.run(cmd, input=x.numpy().tobytes(), capture_output=True, check=True, timeout=600)
    return torch.frombuffer(bytearray(res.stdout), dtype=torch.float32)


def test_arm64_fmas_and_gelus_match_x86_fma(tmp_path: Path) -> None:
    cpp = tmp_path / "fma.cpp"
    cpp.write_text(_source())
    arm, x86 = tmp_path / "arm", tmp_path / "x86"
    subprocess.run([CXX, *FLAGS, str(cpp), "-o", str(arm)], check=True, capture_output=True, text=True)
    x86_flags = [f for f in FLAGS if f != "-static"] + ["-march=x86-64-v3"]
    subprocess.run(["g++", *x86_flags, str(cpp), "-o", str(x86)], check=True, capture_output=True, text=True)
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4000) * 3, torch.linspace(-7, 7, 3001), torch.tensor([float("inf"), -0.0])])
    got = _run([QEMU, "-L", SYSROOT, str(arm)], x)
    want = _run([str(x86)], x)
    assert got[:2].tolist() == [-(2.0**-46)] * 2  # real fmas
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
