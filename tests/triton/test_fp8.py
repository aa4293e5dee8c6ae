"""fp8 inputs (float8_e4m3fn, float8_e5m2): the Triton GEMM template reads them into tl.dot with
the per-tensor scales on the fp32 accumulator (schedule/fp8dot.py), checked against eager (the
float math on the dequantized values) in the interpreter; compiled offline for sm_90 the dot is
an fp8 wgmma. Rounding to fp8 stays in torch, and so does every fp8 group on the C++ backend."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

import vfuse
from vfuse.ir import Op
from vfuse.schedule import TorchStep

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
F32, BF16 = torch.float32, torch.bfloat16


def _q(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(shape) * 3).to(dtype)


def scaled_gelu(a8: torch.Tensor, b8: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor):
    return F.gelu((a8.to(F32) * sa) @ (b8.to(F32) * sb).t() + bias)


def scaled_bias(a8: torch.Tensor, b8: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (0.37 * a8.to(F32)) @ (b8.to(F32) * 1.5).t() + bias  # python float scales


def plain_bf16(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
    return a8.to(BF16) @ b8.t().to(BF16)  # the transpose before the cast, no scales


def scaled_mm(a8: torch.Tensor, b8: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor):
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=BF16)


def linear_3d(x8: torch.Tensor, w8: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor):
    return F.linear(x8.to(F32) * sx, w8.to(F32) * sw, bias)


def batched(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
    return (a8.to(F32) * 0.5) @ b8.to(F32).transpose(1, 2)


def _scales() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(0.37), torch.tensor(1.7)


# name: (fn, inputs, tolerance); M 1 / 33 / 130, N 7 / 96, K 16 / 80 (tails of the 32- and 128-deep K steps)
CASES: dict[str, tuple[Callable, tuple[torch.Tensor, ...], float]] = {
    "e4m3_gelu_33x96x80": (scaled_gelu, (_q((33, 80), E4), _q((96, 80), E4), *_scales(), torch.randn(96)), 1e-4),
    "e5m2_gelu_1x7x16": (scaled_gelu, (_q((1, 16), E5), _q((7, 16), E5), *_scales(), torch.randn(7)), 1e-4),
    "e5m2_floats_130x7x80": (scaled_bias, (_q((130, 80), E5), _q((7, 80), E5), torch.randn(7)), 1e-4),
    "e4m3_e5m2_33x7x16": (scaled_bias, (_q((33, 16), E4), _q((7, 16), E5), torch.randn(7)), 1e-4),
    "e4m3_bf16_130x96x16": (plain_bf16, (_q((130, 16), E4), _q((96, 16), E4)), 1e-2),
    "linear_3d_e4m3_2x17x7x80": (linear_3d, (_q((2, 17, 80), E4), _q((7, 80), E4), *_scales(), torch.randn(7)), 1e-4),
    "batched_e5m2_3x33x7x16": (batched, (_q((3, 33, 16), E5), _q((3, 7, 16), E5)), 1e-4),
    "scaled_mm_33x96x80": (scaled_mm, (_q((33, 80), E4), _q((96, 80), E4), *_scales(), torch.randn(96).to(BF16)), 1e-2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp8_gemm_reads_fp8_into_the_dot(case: str) -> None:
    fn, inputs, tol = CASES[case]
    compiled = compile_triton(fn, inputs)
    got, want = compiled(*inputs), fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())
    assert compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0, compiled.stats
    (k,) = compiled.compiled.executor.program.kernels
    assert k.gpu is not None and k.gpu.dot == "fp8" and k.fp8 is not None and k.gpu.block_k >= 32
    source = compiled.compiled.executor.source
    # the operand tiles are the fp8 buffers' own loads, straight into the (GPU) dot
    assert re.search(r"\n\s+a_ = tl\.load\([^\n]*other=0\.0\)\n", source), source
    assert re.search(r"\n\s+b_ = tl\.load\([^\n]*other=0\.0\)\n", source), source
    assert "acc_ = tl.dot(a_, b_, acc_)" in source


def test_bf16_cast_then_scale_keeps_the_per_tile_prologue() -> None:
    """Eager rounds the scaled bf16 operand to bf16: the template widens fp8, scales and rounds per
    tile (bf16 dot), not the folded fp8 dot."""

    def fn(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
        return (a8.to(BF16) * 0.3) @ (b8.to(BF16) * 1.1).t()

    inputs = (_q((33, 80), E4), _q((7, 80), E4))
    compiled = compile_triton(fn, inputs)
    torch.testing.assert_close(compiled(*inputs).float(), fn(*inputs).float(), rtol=1e-2, atol=1e-1)
    (k,) = compiled.compiled.executor.program.kernels
    assert k.gpu is not None and k.gpu.dot == "bf16" and k.fp8 is None


def test_a100_has_no_fp8_dot_and_widens_e5m2_per_tile() -> None:
    """sm_80: no fp8 tensor cores, so e5m2 operands are widened per tile for an exact fp32 dot; Triton
    has no e4m3 type there at all, so e4m3 is widened in torch and the GEMM compiled after it."""
    for case, dot in (("e5m2_gelu_1x7x16", "fp32"), ("e4m3_gelu_33x96x80", "fp32")):
        fn, inputs, tol = CASES[case]
        compiled = vfuse.compile(fn, inputs, backend="triton", target="a100")
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=tol, atol=1e-3)
        (k,) = compiled.compiled.executor.program.kernels
        assert k.gpu is not None and k.gpu.dot == dot and k.fp8 is None
        source = compiled.compiled.executor.source
        if case.startswith("e5m2"):
            assert "_vf_e5m2_2f(tl.load(" in source and not _reasons(compiled)
        else:
            assert "fp8e4" not in source and "_vf_e4m3_2f(" not in source.split("_VF_INTERPRETED =")[-1]
            assert all("e4m3 on a GPU before sm_89" in r for r in _reasons(compiled)) and _reasons(compiled)


def test_every_fp8_value_widens_exactly() -> None:
    """All 256 bit patterns of both formats (NaN, inf, subnormals, -0) through a pointwise kernel:
    bit for bit eager (the interpreter's own fp8 conversion gets NaN and inf wrong)."""

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a.to(F32) * 1.0, b.t().to(F32) - 0.0

    bits = torch.arange(256, dtype=torch.uint8)
    inputs = (bits.view(E4).reshape(16, 16), bits.view(E5).reshape(16, 16))
    compiled = compile_triton(fn, inputs)
    assert compiled.stats.torch_calls == 0, compiled.stats
    for got, want in zip(compiled(*inputs), fn(*inputs), strict=True):
        same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
        assert bool(same.all())


def _reasons(compiled: object) -> list[str]:
    steps = compiled.compiled.executor.program.steps  # type: ignore[attr-defined]
    return [s.reason for s in steps if isinstance(s, TorchStep)]


def test_rounding_to_fp8_stays_in_torch() -> None:
    """A quantize (x / s).to(fp8) is torch's rounding (its overflow behaviour included: e4m3fn
    saturates at 448 on CPU in torch 2.13, Triton's cvt too, the interpreter not): only the division
    and the cast run in torch, the rest of their group and the GEMM are compiled."""

    def fn(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        xq = (x / s).to(E4)
        return (xq.to(F32) * s) @ w8.to(F32).t()

    inputs = (torch.randn(33, 80) * 40, _q((7, 80), E4), torch.tensor(0.125))  # some |x / s| past 448
    compiled = compile_triton(fn, inputs)
    got, want = compiled(*inputs), fn(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-2)
    assert any("rounding to fp8 stays in torch" in r for r in _reasons(compiled))
    steps = [s for s in compiled.compiled.executor.program.steps if isinstance(s, TorchStep)]
    assert [len(s.nodes) for s in steps] == [2] and compiled.stats.kernels == 2, compiled.stats


def test_cpp_backend_widens_fp8_in_torch() -> None:
    fn, inputs, _ = CASES["e4m3_gelu_33x96x80"]
    compiled = vfuse.compile(fn, inputs, backend="cpp")
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)
    reasons = _reasons(compiled)
    assert reasons and all("the C++ backend has no fp8 type" in r for r in reasons), reasons
    # only the widening casts run in torch: the GEMM, its scales and epilogue are one template
    steps = compiled.compiled.executor.program.steps
    side = [n for s in steps if isinstance(s, TorchStep) for n in s.nodes]
    assert len(side) == 2 and all(compiled.compiled.graph[n].op is Op.CAST for n in side), steps
    assert compiled.stats.kernels == 1, compiled.stats


# ---- offline compile for sm_90: fp8 wgmma, no spills ----


@pytest.mark.parametrize("dtypes", [(E4, E4, 512), (E4, E5, 16)], ids=["e4m3_k512", "e4m3_e5m2_k16"])
def test_fp8_gemm_compiles_to_fp8_wgmma_without_spills(dtypes: tuple, tmp_path: Path) -> None:
    from tests.triton.test_contractions import compile_template

    from vfuse.targets import get_target

    da, db, kk = dtypes
    inputs = (_q((512, kk), da), _q((512, kk), db), *_scales(), torch.randn(512))
    ln, compiled, res = compile_template(scaled_gelu, inputs, tmp_path)
    assert 0 < res.registers <= 255 and res.spill_bytes == 0, res.as_dict()
    assert res.shared_bytes <= get_target("h100").smem_per_sm, res.as_dict()
    kinds = set(
        re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k32\.f32\.(e4m3|e5m2)\.(e4m3|e5m2)", compiled.asm["ptx"])
    )
    names = {E4: "e4m3", E5: "e5m2"}
    assert kinds == {(names[da], names[db])}, kinds
    print(dtypes, ln.warps, ln.stages, res.as_dict())  # docs/gpu.md's figures (pytest -s)


def test_large_fp8_gemm_stays_a_template() -> None:
    """torch's alternative is an fp32 matmul of the widened operands (the IR's MATMUL is fp32): the
    library verdict that sends a 4096^3 fp32 GEMM to cuBLAS must not take the fp8 dot there."""
    fn, _, _ = CASES["e4m3_gelu_33x96x80"]
    inputs = (_q((4096, 4096), E4), _q((4096, 4096), E4), *_scales(), torch.randn(4096))
    program = compile_triton(fn, inputs).compiled.executor.program  # compiled, never run here
    assert not [s for s in program.steps if isinstance(s, TorchStep)]
    (k,) = program.kernels
    # 128 deep in K (the on-chip rule may halve the 128 x 128 output tile: it measured 40 B spilled)
    assert k.fp8 is not None and k.gpu is not None and k.gpu.dot == "fp8" and k.gpu.block_k == 128
