"""Offline compilation for sm_90 (H100 / H200) without a GPU: every kernel family's Triton kernels
go through triton.compile to PTX and cubin; registers, spills and shared memory are read from the
result (`TritonKernel.resources()`, `codegen.triton.pressure`). None spills, shared memory fits the
preset, contiguous loads are vectorized, and a kernel past 2^31 elements compiles with 64-bit offsets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import hand_plan, inputs
from tests.kernel_families import FAMILIES
from tests.triton.triton_cases import EXTRA, compile_triton

from vfuse.codegen.triton import pressure, render
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule import build
from vfuse.targets import get_target

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

H100 = get_target("h100")
OFFLINE = ["pointwise", "layernorm_gelu", "rmsnorm_silu", "softmax", "column_sum", "view_multiaxis", "embedding"]
OFFLINE += ["int_division", "casts_bf16", "dropout"]
CASES = {**FAMILIES, **{k: EXTRA[k] for k in ("softmax_looped", "max_argmax_nan")}}


@pytest.mark.parametrize("family", [*OFFLINE, "softmax_looped", "max_argmax_nan"])
def test_family_compiles_for_sm90_without_spills(family: str) -> None:
    fn, args = CASES[family]
    kernels = compile_triton(fn, args).compiled.executor.kernels
    assert kernels
    for k in kernels:
        res = k.resources(sm=90)
        assert set(res) == {"registers", "spill_bytes", "shared_bytes"}
        assert 0 < res["registers"] <= 255 and res["spill_bytes"] == 0, (k.name, res)
        assert res["shared_bytes"] <= H100.smem_per_sm, (k.name, res)


@pytest.mark.parametrize("family", ["pointwise_even", "pointwise", "layernorm_gelu"])
def test_contiguous_loads_and_stores_are_vector_accesses(family: str) -> None:
    """Where the element count and row length are multiples of 4 (the mask is then constant over
    4 lanes); on an odd count (pointwise: 37 x 41) in the mask-free full blocks."""
    fn, args = {**CASES, "pointwise_even": (FAMILIES["pointwise"][0], (torch.randn(37, 40), torch.randn(40)))}[family]
    (k,) = compile_triton(fn, args).compiled.executor.kernels
    ptx = k.compiled(sm=90).ptx
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx


def _wide_and_narrow_ptx(tmp_path: Path, columns: int) -> tuple[str, str]:
    b = GraphBuilder()
    x, y = inputs(b, ((1 << 15, columns), DType.F32), ((columns,), DType.F32))
    graph = b.build([b.add(Op.MUL, [x, y])])
    rendered = render(build(hand_plan(graph, [[n.name for n in graph.compute_nodes]]), H100))
    (res,) = pressure(rendered, tmp_path).values()
    assert res.spill_bytes == 0
    return rendered.source, res.ptx


def test_a_kernel_past_2_31_elements_uses_64_bit_offsets(tmp_path: Path) -> None:
    source, ptx = _wide_and_narrow_ptx(tmp_path, (1 << 16) + 1)  # 2^31 + 2^15 elements
    assert "pid_ = tl.program_id(0).to(tl.int64)" in source and "mul.lo.s64" in ptx
    source, ptx = _wide_and_narrow_ptx(tmp_path, 1 << 10)
    assert "pid_ = tl.program_id(0)\n" in source and "mul.lo.s64" not in ptx


BF16_ROWS = {
    "layernorm_gelu": lambda x, w: F.gelu(F.layer_norm(x, (x.shape[-1],), w)),
    "rmsnorm_silu": lambda x, w: F.silu(F.rms_norm(x, (x.shape[-1],), w)),
    "softmax_scale": lambda x, w: torch.softmax(x * 0.125 + w, -1),
}


def _row_kernel(fn: Callable, dtype: torch.dtype) -> tuple[int, str]:
    (k,) = compile_triton(fn, (torch.randn(64, 4096).to(dtype), torch.randn(4096).to(dtype))).compiled.executor.kernels
    return k.warps, k.compiled(sm=90).ptx


def _instructions(ptx: str) -> int:
    return sum(1 for ln in ptx.splitlines() if ln.startswith("\t") and ln.strip()[:1].isalpha())


@pytest.mark.parametrize("case", sorted(BF16_ROWS))
def test_bf16_rows_load_32_bytes_per_thread_and_convert_natively(case: str) -> None:
    """bf16 rows (the device bench's, 4096 wide): warps chosen by bytes (32 per thread and operand,
    as fp32's: half the warps), two 16-byte loads per thread and operand, bf16 conversions as `cvt`
    (the interpreter's integer rounding compiled to ~7 ALU ops per element), and no more
    instructions per element than the fp32 kernel."""
    w32, ptx32 = _row_kernel(BF16_ROWS[case], torch.float32)
    w16, ptx16 = _row_kernel(BF16_ROWS[case], torch.bfloat16)
    assert (w32, w16) == (16, 8)
    assert ptx16.count("ld.global.v4.b32") == 4 and "ld.global.b16" not in ptx16
    assert "cvt.rn.bf16x2.f32" in ptx16 and ", 32767;" not in ptx16  # the integer rounding's b + 0x7FFF
    per32, per16 = _instructions(ptx32) / (4096 / (32 * w32)), _instructions(ptx16) / (4096 / (32 * w16))
    assert per16 <= per32, (case, per16, per32)
