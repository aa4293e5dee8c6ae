"""fp16/bf16 arithmetic runs in fp32 inside a kernel; where the program casts out of it, the value it
sees is rounded exactly as torch rounds (docs/semantics.md). Found by the ARM64 run of a cast chain."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vfuse

CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bf16_mul_then_float_exp": lambda x: (x.to(torch.bfloat16) * 3).float().exp(),
    "f16_mul_then_float_exp": lambda x: (x.half() * 3).float().exp(),
    "bf16_to_int": lambda x: (x.to(torch.bfloat16) * 37).to(torch.int32),
    "f16_to_bf16": lambda x: (x.half() * 1.7).to(torch.bfloat16).float(),
    "bf16_sum_input": lambda x: (x.to(torch.bfloat16) + 0.1).float().sum(-1),
    # eager takes the scalar of a low-precision mul / true div at fp32, of add, sub, pow rounded
    "f16_mul_scalar": lambda x: (x.half() * 0.1).float(),
    "f16_div_scalar": lambda x: (x.half() / 0.3).float(),
    "bf16_mul_scalar": lambda x: (x.to(torch.bfloat16) * 1.7).float(),
    "bf16_add_scalar": lambda x: (x.to(torch.bfloat16) + 0.1).float(),
    "bf16_rsub_scalar": lambda x: (0.3 - x.to(torch.bfloat16)).float(),
    "f16_pow_scalar": lambda x: (x.half().abs() ** 1.37).float(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cast_out_of_low_precision_sees_the_rounded_value(case: str) -> None:
    fn = CASES[case]
    x = torch.randn(7, 131, generator=torch.Generator().manual_seed(5)) * 2
    compiled = vfuse.compile(fn, (x,))
    assert compiled.stats.backend == "cpp"
    want = fn(x)
    # exp and sum add fp32 rounding only; the casts themselves must agree exactly.
    torch.testing.assert_close(compiled(x), want, rtol=3e-6, atol=1e-5)
