"""Faults on the Triton path raise what the C++ path raises: a gather index out of range (the
first in row-major order, checked over the whole index buffer by a check kernel; the gather
itself clamps, so it never reads outside the table) and integer division by zero."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

import vfuse
from vfuse.errors import VfuseIndexError, VfuseZeroDivisionError

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def _message(fn: object, inputs: tuple[torch.Tensor, ...], backend: str) -> str:
    compiled = compile_triton(fn, inputs) if backend == "triton" else vfuse.compile(fn, inputs, backend=backend)
    with pytest.raises((VfuseIndexError, VfuseZeroDivisionError)) as info:
        compiled(*inputs)
    return str(info.value)


def test_embedding_index_out_of_range_raises_like_the_cpu_path() -> None:
    fn = lambda w, i: F.embedding(i, w) * 2  # noqa: E731
    table, ok = torch.randn(10, 24), torch.tensor([[0, 9, 3], [1, 1, 7]])
    compiled = compile_triton(fn, (table, ok))
    torch.testing.assert_close(compiled(table, ok), fn(table, ok))
    bad = torch.tensor([[0, 9, 3], [12, -1, 10]])  # 12 is the first offender in row-major order
    with pytest.raises(VfuseIndexError, match="index 12 is out of bounds for dimension 0 with size 10"):
        compiled(table, bad)
    assert _message(fn, (table, bad), "triton") == _message(fn, (table, bad), "cpp")
    torch.testing.assert_close(compiled(table, ok), fn(table, ok))  # the fault record was cleared


def test_wrapping_gather_takes_negative_indices_and_refuses_past_minus_rows() -> None:
    fn = lambda x, i: x[i] * 2  # noqa: E731
    x, i = torch.randn(11, 3), torch.tensor([-1, 0, 10, -11])
    compiled = compile_triton(fn, (x, i))
    torch.testing.assert_close(compiled(x, i), fn(x, i))
    with pytest.raises(VfuseIndexError, match="index -12 is out of bounds"):
        compiled(x, torch.tensor([0, -12, 11, 3]))


def test_integer_division_by_zero_raises() -> None:
    fn = lambda a, b: a // b + a % b  # noqa: E731
    a, b = torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,)) * torch.tensor([1, -1]).repeat(32)
    compiled = compile_triton(fn, (a, b))
    assert torch.equal(compiled(a, b), fn(a, b))
    b[37] = 0
    assert "integer division by zero" in _message(fn, (a, b), "triton")
    assert _message(fn, (a, b), "triton") == _message(fn, (a, b), "cpp")
    imin = torch.tensor([-(2**63), 7]), torch.tensor([-1, -1])  # INT_MIN // -1 wraps, as on the C++ path
    assert torch.equal(compile_triton(lambda a, b: a // b, imin)(*imin), torch.tensor([-(2**63), -7]))
