"""Pointwise kernels on element counts that are not a multiple of the vector width: the full
blocks run mask-free (`GpuLaunch.unmasked`), the tail block masked. Checked in Triton's
interpreter against eager (primes, 1, 0, a fault in either part, dropout's bits equal to the C++
path's), and compiled offline for sm_90: the mask-free part loads and stores 16-byte vectors."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

import vfuse
from vfuse.errors import VfuseZeroDivisionError

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def _chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y) * torch.sigmoid(y)


def _flat(compiled: object) -> object:
    (k,) = compiled.compiled.executor.kernels  # type: ignore[attr-defined]
    return k


@pytest.mark.parametrize("n", [0, 1, 1024, 2053])
def test_odd_counts_match_eager(n: int) -> None:
    x, y = torch.randn(n), torch.randn(n)
    compiled = compile_triton(_chain, (x, y))
    torch.testing.assert_close(compiled(x, y), _chain(x, y))
    if n == 2053:  # 2 full blocks of 1024 mask-free, the third program masked
        source = _flat(compiled).source
        assert "if pid_ < 2:" in source and "m_ = xf_ < 2053" in source
    if n == 1024:
        assert "mask=" not in _flat(compiled).source  # no tail at all


def test_broadcast_views_and_narrow_outputs_on_a_prime_count() -> None:
    """37 x 59 = 2183 elements: a broadcast row, a transposed view, a bool and an int8 output
    (16-byte vectors of 1-byte elements), a bf16 one."""
    fn = lambda x, y, z: ((x + y) > z.t(), (x * 3).to(torch.int8), (x - y).to(torch.bfloat16))  # noqa: E731
    x, y, z = torch.randn(37, 59) * 20, torch.randn(59), torch.randn(59, 37)
    compiled = compile_triton(fn, (x, y, z))
    for got, want in zip(compiled(x, y, z), fn(x, y, z), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("bad", [5, 2052])  # a zero divisor in the mask-free part, then in the tail
def test_zero_division_is_recorded_once_from_either_part(bad: int) -> None:
    fn = lambda a, b: a // b  # noqa: E731
    a, b = torch.randint(-50, 50, (2053,)), torch.randint(1, 9, (2053,))
    compiled = compile_triton(fn, (a, b))
    assert torch.equal(compiled(a, b), fn(a, b))
    assert len(compiled.compiled.executor.rendered.faults) == 1  # one slot, though the division is rendered twice
    b[bad] = 0
    with pytest.raises(VfuseZeroDivisionError, match="integer division by zero"):
        compiled(a, b)


def test_dropout_draws_the_cpp_paths_bits_in_both_parts() -> None:
    fn = lambda x: F.dropout(x, 0.3, training=True) * 2  # noqa: E731
    x = torch.randn(2053)
    torch.manual_seed(7)
    got = compile_triton(fn, (x,))(x)
    torch.manual_seed(7)
    want = vfuse.compile(fn, (x,), backend="cpp")(x)
    assert torch.equal(got, want) and 0.2 < (got == 0).float().mean() < 0.4


def test_the_mask_free_part_of_an_odd_count_loads_and_stores_16_byte_vectors() -> None:
    """Offline for sm_90: 4099 fp32 elements (prime). Masked by `i < 4099` (constant over one lane
    only) every access was a 4-byte one; now the four full blocks use `ld/st.global.v4.b32`, the
    tail program 4-byte ones."""
    x = torch.randn(4099)
    ptx = _flat(compile_triton(_chain, (x, x))).compiled(sm=90).ptx
    accesses = set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx))
    assert {"ld.global.v4.b32", "st.global.v4.b32"} <= accesses, accesses
