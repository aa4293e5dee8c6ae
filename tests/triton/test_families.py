"""Every kernel family through the Triton renderer (backend="triton", target="h100"), its kernels
run by Triton's interpreter on CPU tensors, against eager torch; the dropout mask against the C++
path's under the same seed; bf16 and fp16 casts bit for bit as the C++ path rounds them."""

from __future__ import annotations

import pytest
import torch
from tests.kernel_families import FAMILIES, RANDOM
from tests.triton.triton_cases import EXTRA, TOLERANCE, as_list, compile_triton

import vfuse

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

CASES = {**FAMILIES, **EXTRA}


@pytest.mark.parametrize("family", sorted(set(CASES) - RANDOM))
def test_family_matches_eager(family: str) -> None:
    fn, inputs = CASES[family]
    compiled = compile_triton(fn, inputs)
    assert compiled.stats.backend == "triton"
    got, want = as_list(compiled(*inputs)), as_list(fn(*inputs))
    tol = TOLERANCE.get(family, 2e-5)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("family", ["layernorm_gelu", "rmsnorm_silu", "softmax", "column_sum", "view_multiaxis"])
def test_one_kernel_per_fused_group(family: str) -> None:
    """The Triton program runs the schedule's kernels: the seed patterns are one kernel each."""
    fn, inputs = CASES[family]
    compiled = compile_triton(fn, inputs)
    assert compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0
    assert "def k0(" in compiled.compiled.executor.source


def test_dropout_mask_is_the_cpu_paths_for_the_same_seed() -> None:
    fn, inputs = FAMILIES["dropout"]  # dropout(x, 0.3) + 1: dropped elements are exactly 1
    triton_fn, cpp_fn = compile_triton(fn, inputs), vfuse.compile(fn, inputs, backend="cpp")
    for seed in (0, 7):
        torch.manual_seed(seed)
        got = triton_fn(*inputs)
        torch.manual_seed(seed)
        want = cpp_fn(*inputs)
        assert torch.equal(got == 1, want == 1)
        assert 0.2 < float((got == 1).float().mean()) < 0.4
        torch.testing.assert_close(got, want)  # kept values: 1 ulp (g++ contracts x * s + 1 to an FMA)
    torch.manual_seed(0)
    first = triton_fn(*inputs)
    assert not torch.equal(first == 1, triton_fn(*inputs) == 1)  # a fresh seed per call


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: (a.bfloat16() * b.bfloat16() + 1).float().sum(-1),
        lambda a, b: (a.bfloat16() * b.bfloat16() + 1).exp(),
        lambda a, b: (a.half() / 3 + b.half()).float(),
    ],
    ids=["bf16_cast_sum", "bf16_store", "f16_cast"],
)
def test_low_precision_rounds_as_the_cpu_path(fn: object) -> None:
    """fp16/bf16 arithmetic runs in fp32 and is rounded where stored or cast (docs/semantics.md):
    the same bits as the C++ path."""
    inputs = (torch.randn(4, 9), torch.randn(4, 9))
    got = compile_triton(fn, inputs)(*inputs)
    want = vfuse.compile(fn, inputs, backend="cpp")(*inputs)
    assert got.dtype == want.dtype and torch.equal(got, want)
