"""The Triton contraction templates (codegen/triton/gemm.py, conv.py, attention.py) in Triton's
interpreter against eager: GEMM with prologues (dequantize) and epilogues (bias + GELU, quantize,
dropout with the C++ path's mask), odd tails, batch broadcasting, fp16 / bf16 operands; Linear
on 3-D input; conv as implicit GEMM (stride 1 / 2, padding, dilation, groups, odd channels);
FlashAttention-2 (causal, GQA, boolean and additive masks, fully masked rows, odd head dims).
Each group is one kernel. Shapes stay tiny: each program instance costs the interpreter
milliseconds."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import hand_plan, inputs
from tests.triton.triton_cases import compile_triton

import vfuse
from vfuse.codegen.triton import pressure, render
from vfuse.codegen.triton.autotune import Autotuner, tune_key
from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.offline import resources_of
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.runtime.compiled import InterpExecutor
from vfuse.runtime.triton import TritonExecutor
from vfuse.schedule import Segment, build
from vfuse.schedule.gpu import candidates
from vfuse.targets import get_target

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def _dequant_linear(x: torch.Tensor, wq: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """int8 weight, per-channel scale and zero point 3: dequantize -> linear -> quantize."""
    y = x @ ((wq.float() - 3.0) * s[:, None]).t()
    return (y / 0.05).round().clamp(-128, 127).to(torch.int8)


def _mask_rows() -> torch.Tensor:
    """An additive mask with -inf holes and a fully masked row (eager gives 0 there). A boolean
    mask is lowered to this (a `where` the schedule stores before the attention kernel)."""
    m = torch.where(torch.rand(7, 11) > 0.3, 0.0, float("-inf"))
    m[:, 0] = 0.0
    m[2] = float("-inf")
    return m


F16, BF16 = torch.float16, torch.bfloat16
Case = tuple[Callable, tuple[torch.Tensor, ...], float]
CASES: dict[str, Case] = {
    "attention_residual": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v) + q,
        tuple(torch.randn(1, 2, 9, 16) for _ in range(3)),
        2e-5,
    ),
    "vector_matmul": (lambda a, b: a @ b, (torch.randn(7), torch.randn(7, 3)), 2e-5),  # a [3] store of a [1, 3] tile
    "row_matmul_1xn": (lambda a, b: a @ b + 1, (torch.randn(1, 7), torch.randn(7, 3)), 2e-5),
    "conv_depthwise": (
        lambda x, w: F.conv2d(x, w, padding=1, groups=4),
        (torch.randn(1, 4, 5, 5), torch.randn(4, 1, 3, 3)),
        2e-5,
    ),
    "attention_causal_more_queries": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (torch.randn(1, 1, 9, 16), torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16)),
        2e-5,
    ),
    "linear_bias_gelu": (
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        (torch.randn(37, 29), torch.randn(19, 29), torch.randn(19)),
        2e-5,
    ),
    "matmul_broadcast_batch": (lambda a, b: (a @ b) * 0.5, (torch.randn(2, 3, 13, 17), torch.randn(3, 17, 11)), 2e-5),
    "linear_3d_relu": (lambda x, w: F.relu(F.linear(x, w)), (torch.randn(2, 5, 24), torch.randn(10, 24)), 2e-5),
    "k_tail_over_blocks": (lambda a, b: a @ b, (torch.randn(9, 70), torch.randn(70, 21)), 2e-5),
    "linear_f16": (
        lambda x, w, b: F.linear(x, w, b),
        (torch.randn(20, 40).to(F16), torch.randn(24, 40).to(F16), torch.randn(24).to(F16)),
        2e-2,
    ),
    "matmul_bf16_silu": (
        lambda a, b: F.silu(a @ b),
        (torch.randn(17, 32).to(BF16), torch.randn(32, 18).to(BF16)),
        3e-2,
    ),
    "cast_prologue_f16": (lambda x, w: x.half() @ w.t(), (torch.randn(16, 33), torch.randn(20, 33).to(F16)), 2e-2),
    "dequant_quant": (
        _dequant_linear,
        (torch.randn(11, 24), torch.randint(-128, 128, (13, 24), dtype=torch.int8), torch.rand(13) * 0.02),
        1.0,
    ),
    "conv3x3_bias_relu": (
        lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1)),
        (torch.randn(2, 3, 7, 9), torch.randn(5, 3, 3, 3), torch.randn(5)),
        2e-5,
    ),
    "conv_stride2_dilated": (
        lambda x, w: F.conv2d(x, w, stride=2, padding=2, dilation=2),
        (torch.randn(1, 4, 9, 8), torch.randn(6, 4, 3, 3)),
        2e-5,
    ),
    "conv_groups_flatten": (
        lambda x, w: F.conv2d(x, w, stride=(2, 1), groups=2).flatten(1) + 1,
        (torch.randn(1, 4, 7, 7), torch.randn(6, 2, 3, 3)),
        2e-5,
    ),
    "conv_f16": (
        lambda x, w: F.conv2d(x, w, padding=1),
        (torch.randn(1, 3, 6, 6).to(F16), torch.randn(4, 3, 3, 3).to(F16)),
        2e-2,
    ),
    "attention_causal_gqa": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) * 2,
        (torch.randn(1, 4, 19, 16), torch.randn(1, 2, 19, 16), torch.randn(1, 2, 19, 16)),
        2e-5,
    ),
    "attention_masked_row": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (torch.randn(1, 2, 7, 24), torch.randn(1, 2, 11, 24), torch.randn(1, 2, 11, 24), _mask_rows()),
        2e-5,
    ),
    "attention_additive_mask": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
        (torch.randn(1, 2, 9, 16), torch.randn(1, 2, 21, 16), torch.randn(1, 2, 21, 16), torch.randn(1, 2, 1, 21)),
        2e-5,
    ),
    "attention_f16_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (torch.randn(1, 2, 20, 32).to(F16), torch.randn(1, 2, 20, 32).to(F16), torch.randn(1, 2, 20, 32).to(F16)),
        2e-2,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_template_matches_eager_in_one_kernel(case: str) -> None:
    fn, inputs, tol = CASES[case]
    compiled = compile_triton(fn, inputs)
    got, want = compiled(*inputs), fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype is torch.int8:  # quantized: a rounding tie may land on the other side
        assert (got.int() - want.int()).abs().max() <= 1 and (got == want).float().mean() > 0.95
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0, compiled.stats
    source = compiled.compiled.executor.source
    assert "template" in source and "tl.dot(" in source


def test_gemm_dropout_epilogue_has_the_cpu_paths_mask() -> None:
    """Dropout after a linear: the counter-based RNG in the GEMM's epilogue draws the mask the C++
    path draws for the same seed (the C++ GEMM template fuses the same epilogue)."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.dropout(x @ w.t(), 0.4, training=True)

    inputs = (torch.randn(13, 20), torch.randn(17, 20))
    triton_fn, cpp_fn = compile_triton(fn, inputs), vfuse.compile(fn, inputs, backend="cpp")
    assert triton_fn.stats.kernels == 1 and triton_fn.stats.torch_calls == 0
    for seed in (0, 5):
        torch.manual_seed(seed)
        got = triton_fn(*inputs)
        torch.manual_seed(seed)
        want = cpp_fn(*inputs)
        assert torch.equal(got == 0, want == 0) and 0.3 < float((got == 0).float().mean()) < 0.5
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_tiles_come_from_the_schedule() -> None:
    """The renderer writes the schedule's blocks (clamped to the sizes, at least 16 for tl.dot)."""
    fn, inputs, _ = CASES["k_tail_over_blocks"]
    (k,) = compile_triton(fn, inputs).compiled.executor.program.kernels
    assert k.gpu is not None and (k.gpu.block_m, k.gpu.block_n, k.gpu.block_k) == (16, 32, 16)
    assert k.gpu.dot == "fp32" and k.gpu.programs == 1
    source = compile_triton(fn, inputs).compiled.executor.source
    assert "for k0_ in range(5):" in source and "mk_ = rk_ < 70" in source


# ---- offline compiles for sm_90 (H100 / H200): no GPU needed ----

OFFLINE: dict[str, tuple[Callable, tuple[torch.Tensor, ...]]] = {
    "gemm_f16_bias_gelu": (
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        (torch.randn(512, 512).to(F16), torch.randn(512, 512).to(F16), torch.randn(512).to(F16)),
    ),
    "gemm_bf16": (lambda a, b: a @ b, (torch.randn(256, 256).to(BF16), torch.randn(256, 256).to(BF16))),
    "gemm_f32": (lambda a, b: torch.relu(a @ b), (torch.randn(256, 256), torch.randn(256, 256))),
    "conv_f16": (
        lambda x, w: F.relu(F.conv2d(x, w, padding=1)),
        (torch.randn(8, 64, 32, 32).to(F16), torch.randn(128, 64, 3, 3).to(F16)),
    ),
    # the device bench's conv_bn_relu at a quarter of its batch: NHWC, K steps within a tap
    "conv_bf16_nhwc_bn_relu": (
        lambda x, w, m, v: F.batch_norm(F.conv2d(x, w, padding=1), m, v, training=False).relu(),
        (
            torch.randn(8, 128, 56, 56).to(BF16).contiguous(memory_format=torch.channels_last),
            torch.randn(128, 128, 3, 3).to(BF16),
            torch.randn(128).to(BF16),
            (torch.rand(128) + 0.5).to(BF16),
        ),
    ),
    "attention_f16_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        tuple(torch.randn(1, 8, 512, 64).to(F16) for _ in range(3)),
    ),
    "attention_f32": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        tuple(torch.randn(1, 8, 256, 64) for _ in range(3)),
    ),
}
WGMMA = {"gemm_f16_bias_gelu", "gemm_bf16", "conv_f16", "conv_bf16_nhwc_bn_relu", "attention_f16_causal"}
# Every global load of these is 16 bytes wide (cp.async into shared memory or ld.global.v4): their
# operand tiles are read once each, as vectors, with no per-element gathers.
ALL_WIDE = {"conv_bf16_nhwc_bn_relu"}


def compile_template(fn: Callable, inputs: tuple[torch.Tensor, ...], tmp_path: Path) -> tuple[Any, Any, Any]:
    """(launch, compiled kernel, resources) of the graph's one template, compiled for sm_90 with
    the schedule's warps and stages (compiling only: the interpreter never runs these sizes)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton

    rendered = compile_triton(fn, inputs).compiled.executor.rendered
    (ln,) = rendered.launches
    module = load_module(module_path(rendered.source, tmp_path), interpret=False)
    sig = rendered.signatures[ln.fn]
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    options = {"num_warps": ln.warps, "num_stages": ln.stages}
    src = ASTSource(getattr(module, ln.fn), sig, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return ln, compiled, resources_of(compiled)


@pytest.mark.parametrize("case", sorted(OFFLINE))
def test_template_compiles_for_sm90_without_spills(case: str, tmp_path: Path) -> None:
    """No spills, shared memory within the preset, wgmma on the tensor cores at fp16 / bf16, and
    operand tiles read with 16-byte accesses (cp.async into shared memory or ld.global.v4)."""
    ln, compiled, res = compile_template(*OFFLINE[case], tmp_path)
    assert 0 < res.registers <= 255 and res.spill_bytes == 0, (case, res.as_dict())
    assert res.shared_bytes <= get_target("h100").smem_per_sm, (case, res.as_dict())
    ptx = compiled.asm["ptx"]
    assert ("wgmma.mma_async" in ptx) == (case in WGMMA), case
    wide = len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx))
    wide += len(re.findall(r"ld\.global(\.\w+)*\.v4", ptx))
    assert wide > 0, case
    if case in ALL_WIDE:
        narrow = len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x0", ptx))
        narrow += len(re.findall(r"ld\.global(?!(\.\w+)*\.v4)", ptx))
        assert narrow == 0, (case, narrow)
    print(case, ln.warps, ln.stages, res.as_dict())  # the figures docs/gpu.md quotes (pytest -s)


# ---- autotuning (codegen/triton/autotune.py) with a fake timer ----


def test_autotuner_times_each_candidate_once_and_caches_its_choice(tmp_path: Path) -> None:
    fn, inputs, _ = CASES["k_tail_over_blocks"]
    executor = compile_triton(fn, inputs).compiled.executor
    (k,) = executor.program.kernels
    h100 = get_target("h100")
    cands = candidates(k, h100)
    assert cands[0] == k.gpu and len(cands) > 3 and len(set(cands)) == len(cands)

    def fake(kc: Any, program: Any) -> float:  # fastest: 64-deep K steps over 3 stages
        return 1.0 - 0.5 * (kc.gpu.block_k == 64) - 0.25 * (kc.gpu.stages == 3)

    tuner = Autotuner(tmp_path, fake)
    tuned = tuner.tune(executor.program, "h100", lambda kc: candidates(kc, h100))
    (best,) = tuned.kernels
    assert best.gpu.block_k == 64 and best.gpu.stages == 3 and tuner.timed == len(cands)
    # the chosen tiles render and run: the same numbers as eager
    out = TritonExecutor(executor.plan, tuned, render(tuned), tmp_path)(list(inputs))
    torch.testing.assert_close(out[0], fn(*inputs), rtol=2e-5, atol=2e-5)
    assert "for k0_ in range(2):" in render(tuned).source

    def refuse(kc: Any, program: Any) -> float:
        raise AssertionError("a cached choice is not timed again")

    again = Autotuner(tmp_path, refuse)
    assert again.tune(executor.program, "h100", lambda kc: candidates(kc, h100)).kernels == tuned.kernels
    assert again.timed == 0 and tune_key(k, "h100") in json.loads((tmp_path / "triton" / "autotune.json").read_text())
    assert tune_key(k, "a100") != tune_key(k, "h100")
    # no device (no timer) and nothing cached: the table's tiles
    assert Autotuner(tmp_path / "other").tune(executor.program, "h100", lambda kc: cands).kernels == (k,)


def test_attention_dropout_is_one_kernel_with_the_cpu_paths_mask() -> None:
    """Dropout on P (torch's math SDPA: safe softmax, RAND >= p, scale) becomes the attention
    template's own draw for backend="triton"; the C++ path runs the decomposed chain: the same
    seed gives the same output, and the mask does drop."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)

    inputs = tuple(torch.randn(1, 2, 19, 16) for _ in range(3))
    triton_fn, cpp_fn = compile_triton(fn, inputs), vfuse.compile(fn, inputs, backend="cpp")
    assert triton_fn.stats.kernels == 1 and triton_fn.stats.torch_calls == 0, triton_fn.stats
    assert "_vf_rand(dk_lo, dk_hi" in triton_fn.compiled.executor.source
    for seed in (0, 9):
        torch.manual_seed(seed)
        got = triton_fn(*inputs)
        torch.manual_seed(seed)
        want = cpp_fn(*inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = F.scaled_dot_product_attention(*inputs, is_causal=True)
    assert not torch.allclose(got, plain, atol=1e-3)
    graph = triton_fn.compiled.graph  # the SDPA's own reference (a torch fallback) draws the same mask
    torch.manual_seed(9)
    torch.testing.assert_close(InterpExecutor(graph)(list(inputs))[0], want, rtol=1e-5, atol=1e-5)


def test_a_template_past_2_31_elements_uses_64_bit_offsets(tmp_path: Path) -> None:
    """Built and compiled only (the operand alone would be 4 GiB)."""
    b = GraphBuilder()
    x, w = inputs(b, (((1 << 16) + 1, 1 << 15), DType.F16), ((1 << 15, 64), DType.F16))
    graph = b.build([b.add(Op.MATMUL, [x, w])])
    h100 = get_target("h100")
    rendered = render(build(hand_plan(graph, [[n.name for n in graph.compute_nodes]]), h100, triton=True))
    assert "pid_ = tl.program_id(0).to(tl.int64)" in rendered.source
    (res,) = pressure(rendered, tmp_path).values()
    assert res.spill_bytes == 0 and "mul.wide" in res.ptx


@pytest.mark.parametrize("case", ["gemm_grouped_f16", "attention_causal_f16"])
def test_the_tables_full_tiles_in_the_interpreter(case: str) -> None:
    """The h100 table's own tiles (128 x 128 x 64 GEMM, ten rows of tiles: the grouped order wraps
    past GROUP_M = 8; 128 x 64 attention blocks over 300 keys, causal), not clamped to tiny sizes."""
    fn, inputs = {
        "gemm_grouped_f16": (lambda a, b: F.relu(a @ b), (torch.randn(1157, 32).to(F16), torch.randn(32, 130).to(F16))),
        "attention_causal_f16": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            tuple(torch.randn(1, 2, 300, 64).to(F16) for _ in range(3)),
        ),
    }[case]
    compiled = compile_triton(fn, inputs)
    (k,) = compiled.compiled.executor.program.kernels
    assert (k.gpu.block_m, k.gpu.block_n) == ((128, 128) if "gemm" in case else (128, 64))
    want = fn(*(x.float() for x in inputs))
    torch.testing.assert_close(compiled(*inputs).float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("case", ["gemm", "conv", "conv_taps", "attention"])
def test_every_autotuning_candidate_renders_and_matches_eager(case: str, tmp_path: Path) -> None:
    """Whatever tiles the autotuner picks on a device, the kernel computes the same numbers."""
    fn, inputs = {
        "gemm": (lambda a, b: F.gelu(a @ b), (torch.randn(70, 40).to(F16), torch.randn(40, 90).to(F16))),
        "conv": (
            lambda x, w: F.conv2d(x, w, padding=1),
            (torch.randn(1, 3, 9, 9).to(F16), torch.randn(20, 3, 3, 3).to(F16)),
        ),
        "conv_taps": (  # NHWC, K steps within a tap at every candidate's block_k
            lambda x, w: F.conv2d(x, w, padding=1, stride=(1, 2)),
            (torch.randn(1, 16, 7, 9).to(F16), torch.randn(20, 16, 3, 3).to(F16)),
        ),
        "attention": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            tuple(torch.randn(1, 1, 70, 16).to(F16) for _ in range(3)),
        ),
    }[case]
    executor = compile_triton(fn, inputs).compiled.executor
    (k,) = executor.program.kernels
    cands = candidates(k, get_target("h100"))
    assert len(cands) > 2  # distinct after fitting to the sizes
    want = fn(*(x.float() for x in inputs))
    for c in cands:
        tuned = Autotuner(None).tune(executor.program, "h100", lambda kc, c=c: [c])
        assert tuned.kernels[0].gpu == k.gpu  # no timer: the table's tiles stay
        program = dataclasses.replace(
            executor.program,
            steps=tuple(
                dataclasses.replace(s, kernels=(dataclasses.replace(k, gpu=c),)) if isinstance(s, Segment) else s
                for s in executor.program.steps
            ),
        )
        out = TritonExecutor(executor.plan, program, render(program), tmp_path)(list(inputs))[0]
        torch.testing.assert_close(out.float(), want, rtol=3e-3, atol=3e-3, msg=str(c))
