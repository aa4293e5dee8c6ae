"""Identical GEMMs share one include-guarded instance per translation unit (gemm.py `render_gemm`).

Every layer's projection is the same GEMM on other buffers: g++ should optimize it once. The
instance is named by the hash of its text with the epilogue's arguments renamed, so kernels
that differ in shape or epilogue must not share it, and each kernel still computes its own
buffers (numerics against torch, odd shapes).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vfuse.codegen.cpp.gemm import Epilogue, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm.epilogue import EpilogueArg
from vfuse.schedule.microtile import VectorUnit

AVX2 = VectorUnit(8, 16)
_GELU = "v = 0.5f * v * (1.0f + vg_erf(v * 0.70710678118654752f));"


def _bias_gelu(arg: str) -> Epilogue:
    return Epilogue("bias_gelu", (EpilogueArg(arg, "const float*"),), (f"v += {arg}[j];", _GELU))


def _instances(source: str) -> set[str]:
    return set(re.findall(r"^#ifndef VG_GEMM_(\w+)$", source, re.M))


SPECS = {  # name: (m, n, k, epilogue argument)
    "layer0": (37, 53, 29, "p_layer0_bias"),
    "layer1": (37, 53, 29, "p_layer1_bias"),  # layer0's GEMM on other buffers: shared
    "rows38": (38, 53, 29, "p_rows38_bias"),  # another M: its own instance
    "single": (1, 53, 29, "bias"),  # one row
}


def _spec(name: str) -> GemmSpec:
    m, n, k, _ = SPECS[name]
    return GemmSpec(name, m, n, k, trans_b=True, unit=AVX2, linkage='extern "C"')


def _source() -> str:
    return "\n".join(render_gemm(_spec(name), _bias_gelu(arg)) for name, (*_, arg) in SPECS.items())


def test_identical_gemms_render_one_instance() -> None:
    source = _source()
    one = render_gemm(_spec("layer0"), _bias_gelu("p_layer0_bias"))
    other = render_gemm(_spec("layer1"), _bias_gelu("p_layer1_bias"))
    assert _instances(one) == _instances(other)
    assert len(_instances(source)) == 3  # layer0 = layer1, rows38, single
    gelu_tanh = Epilogue("gelu_tanh", (EpilogueArg("p_layer0_bias", "const float*"),), ("v += p_layer0_bias[j];",))
    assert _instances(render_gemm(_spec("layer0"), gelu_tanh)).isdisjoint(_instances(one))  # another epilogue


@pytest.mark.parametrize("nthreads", [1, 2])
def test_each_kernel_computes_its_own_buffers(build, call, nthreads: int) -> None:
    lib = build(_source())
    torch.manual_seed(7)
    for name, (m, n, k, _) in SPECS.items():
        a, w, bias = torch.randn(m, k) / math.sqrt(k), torch.randn(n, k), torch.randn(n)
        out = torch.full((m, n), float("nan"))
        call(lib, name, a, w, out, bias, nthreads=nthreads)
        torch.testing.assert_close(out, F.gelu(a @ w.T + bias), rtol=1e-4, atol=1e-4)


def test_canonical_names_taken_keep_the_kernel_whole() -> None:
    """An argument already called like a canonical name: no renaming, no sharing, still one kernel."""
    spec = _spec("layer0")
    source = render_gemm(spec, _bias_gelu("vg_e0"))
    assert not _instances(source) and f'extern "C" void {spec.name}(' in source


class _Mlp(nn.Module):
    """Two identical Linear + GELU layers (other weights): one GEMM instance for both; then a
    projection with a residual (an instance of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.l0, self.l1, self.out = nn.Linear(48, 48), nn.Linear(48, 48), nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.l1(F.gelu(self.l0(x))))) + x


@pytest.mark.parametrize("dynamic", [False, True])
def test_models_layers_share_instances_and_match_eager(tmp_path, monkeypatch, dynamic: bool) -> None:
    from vfuse.entry.capture import VfuseBackend

    monkeypatch.setenv("VFUSE_DUMP", str(tmp_path))
    torch.manual_seed(0)
    model = _Mlp().eval()
    fn = torch.compile(model, backend=VfuseBackend(strict=True), dynamic=dynamic)
    with torch.no_grad():
        for rows in (29, 31) if dynamic else (29,):
            x = torch.randn(rows, 48)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    (source,) = [p.read_text() for p in tmp_path.glob("*/06_kernels.cpp")]
    gemms = len(re.findall(r"^// vfuse gemm ", source, re.M))
    assert gemms == 3 and len(_instances(source)) == 2
