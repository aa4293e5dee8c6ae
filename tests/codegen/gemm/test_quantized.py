"""GEMM template: operand prologues in the packers and non-fp32 (int8) output.

Data are small integers and scales powers of two, so every product and sum is exact in fp32
whatever the summation order: the int8 results must equal torch's exactly (round half to even,
saturation), through several K blocks (the fp32 workspace) and any thread count.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from vfuse.codegen.cpp.gemm import Blocking, Epilogue, EpilogueArg, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm.prologue import Prologue, render_packer

XQ, WQ, WS, AS = (
    EpilogueArg("xq", "const int8_t*"),
    EpilogueArg("wq", "const int8_t*"),
    EpilogueArg("ws", "const float*"),
    EpilogueArg("as_", "const float*"),
)
# Quantize: q = saturate(round_half_even(v * 0.25) - 3), stored as int8.
QUANT = ("const float qv = vg_clamp(std::nearbyint(v * 0.25f) - 3.0f, -128.0f, 127.0f);",)


def _int8_epilogue(*args: EpilogueArg) -> Epilogue:
    return Epilogue("quant", args, QUANT, "static_cast<int8_t>(qv)", "int8_t")


def _quant(y: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(y * 0.25) - 3.0, -128, 127).to(torch.int8)


# A = (xq - 1) * 0.5 (row-major M x K int8); B = Linear weight wq (N x K int8) * ws[n].
DEQ_A = Prologue((), "(static_cast<float>(xq[r * 70 + c]) - 1.0f) * 0.5f", "c")
DEQ_B_T = Prologue(("const float w = static_cast<float>(wq[c * 70 + r]);",), "w * ws[c]", "r")
LINEAR = GemmSpec("q_linear", 45, 67, 70, a_prologue=DEQ_A, b_prologue=DEQ_B_T, blocking=Blocking(14, 32, 28, 16, 64))
# B row-major K x N int8, K <= KC: no workspace; A read as plain floats.
DEQ_B = Prologue((), "static_cast<float>(wq[r * 40 + c]) * 2.0f", "c")
ONE_BLOCK = GemmSpec("q_one_block", 33, 40, 24, b_prologue=DEQ_B)
# Batched A (per-entry scale, read through `b`) over a B shared by the batch (stride 0).
DEQ_A_B = Prologue((), "static_cast<float>(xq[(b * 19 + r) * 50 + c]) * as_[b]", "c")
CAST_B = Prologue((), "static_cast<float>(wq[r * 21 + c])")
BATCHED = GemmSpec.from_shapes(
    "q_batched", (4, 19, 50), (50, 21), a_prologue=DEQ_A_B, b_prologue=CAST_B, blocking=Blocking(8, 48, 16, 16, 48)
)
FP32 = GemmSpec("f_linear", 45, 67, 70, trans_b=True, blocking=Blocking(14, 32, 28, 16, 64))


def _small(*shape: int) -> torch.Tensor:
    return torch.randint(-8, 9, shape, dtype=torch.int8)


@pytest.fixture(scope="module")
def lib(build):
    return build(
        render_gemm(LINEAR, _int8_epilogue(XQ, WQ, WS))
        + render_gemm(ONE_BLOCK, _int8_epilogue(WQ))
        + render_gemm(BATCHED, _int8_epilogue(XQ, WQ, AS))
        + render_gemm(FP32, Epilogue())
    )


def _null() -> torch.Tensor:
    return torch.empty(0)  # an operand its prologue computes: the pointer is never read


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_dequantized_linear_with_int8_output(lib, call, nthreads: int) -> None:
    torch.manual_seed(nthreads)
    xq, wq, ws = _small(45, 70), _small(67, 70), 2.0 ** torch.randint(-2, 3, (67,)).float()
    out = torch.zeros(45, 67, dtype=torch.int8)
    call(lib, "q_linear", _null(), _null(), out, xq, wq, ws, nthreads=nthreads)
    y = ((xq.float() - 1.0) * 0.5) @ (wq.float() * ws[:, None]).t()
    assert torch.equal(out, _quant(y))


def test_row_major_b_prologue_in_one_k_block(lib, call) -> None:
    torch.manual_seed(10)
    a, wq = _small(33, 24).float(), _small(24, 40)
    out = torch.zeros(33, 40, dtype=torch.int8)
    call(lib, "q_one_block", a, _null(), out, wq)
    assert torch.equal(out, _quant(a @ (wq.float() * 2.0)))


@pytest.mark.parametrize("nthreads", [1, 2])  # 2: each thread runs whole batch entries
def test_batched_prologues_with_shared_b(lib, call, nthreads: int) -> None:
    torch.manual_seed(11)
    xq, wq, scales = _small(4, 19, 50), _small(50, 21), torch.tensor([0.5, 1.0, 2.0, 4.0])
    out = torch.zeros(4, 19, 21, dtype=torch.int8)
    call(lib, "q_batched", _null(), _null(), out, xq, wq, scales, nthreads=nthreads)
    assert torch.equal(out, _quant((xq.float() * scales[:, None, None]) @ wq.float()))


def test_workspace_only_when_partial_sums_cannot_live_in_c() -> None:
    assert "vg_scratch(2" in render_gemm(LINEAR, _int8_epilogue(XQ, WQ, WS))  # int8 C, 5 K blocks
    assert "vg_scratch(2" not in render_gemm(ONE_BLOCK, _int8_epilogue(WQ))  # K <= KC
    fp32 = render_gemm(FP32, Epilogue())
    assert "vg_scratch(2" not in fp32 and "prow" not in fp32  # fp32 C holds its own partial sums


def test_packer_loop_order_follows_inner() -> None:
    cols = render_packer("k", "b", 32, DEQ_B_T, "")  # contiguous along K: K innermost
    rows = render_packer("k", "b", 32, DEQ_B, "")  # contiguous along N: the sliver innermost
    assert cols.index("for (long s = 0") < cols.index("for (long kk = 0")
    assert rows.index("for (long kk = 0") < rows.index("for (long s = 0")


def test_invalid_prologues() -> None:
    with pytest.raises(ValueError, match="no trans_b"):
        GemmSpec("bad", 2, 2, 2, trans_b=True, b_prologue=DEQ_B)
    with pytest.raises(ValueError, match="inner"):
        Prologue((), "0.0f", "k")


def test_packers_and_int8_writeback_vectorize(tmp_path) -> None:
    """The prologue packers and the int8 writeback must stay SIMD loops (g++'s own report)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    src = render_gemm(LINEAR, _int8_epilogue(XQ, WQ, WS))
    cpp = tmp_path / "k.cpp"
    cpp.write_text(src)
    cmd = ["g++", "-std=c++17", "-O3", "-march=native", "-fopenmp", "-fopt-info-vec-optimized", "-c", str(cpp)]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp_path).stderr
    done = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    lines = src.splitlines()
    # The kernel's packers, then the driver (in the GEMM instance named by its hash: gemm.py).
    start = next(i for i, line in enumerate(lines) if "_pack_a(long b," in line)
    simd = [i + 1 for i, line in enumerate(lines) if i > start and line.strip() == "#pragma omp simd"]
    assert len(simd) >= 4  # two packers, the partial-sum and the final writeback loops
    # g++ reports a loop at its `for` line or at a statement early in its body (before the next loop).
    ends = [min(p + 6, q) for p, q in zip(simd, [*simd[1:], len(lines) + 1], strict=True)]
    missing = [p for p, end in zip(simd, ends, strict=True) if not done & set(range(p + 1, end))]
    assert not missing, f"pragmas at lines {missing} not vectorized"
