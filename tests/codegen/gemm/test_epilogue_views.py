"""A GEMM epilogue over a view of the GEMM's output (codegen/cpp/contraction.py `_groups`): a
Linear's output read as `view(b, t, 3, h, d)` (a fused qkv projection) gives the epilogue a 5-D
loop space. Its dims split from the output's in aligned groups, and an index over a whole group
in row-major order collapses back to the flat output index, so the bias is one contiguous load
(`vg_e0[j]`), not div/mod per lane. Checked: the grouping, the rendered load, numerics vs eager
for splits, merges, size-1 dims and primes."""

from __future__ import annotations

import re

import pytest
import torch

import vfuse
from vfuse.codegen.cpp.contraction import _groups


def _source(compiled: object) -> str:
    return compiled.compiled.executor.source  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("shape", "space", "want"),
    [
        ((256, 768), (2, 128, 3, 4, 64), [((0,), (0, 1)), ((1,), (2, 3, 4))]),
        ((256, 768), (256, 768, 1), [((0,), (0,)), ((1,), (1, 2))]),
        ((2, 3, 5), (6, 5), [((0, 1), (0,)), ((2,), (1,))]),
        ((6, 10), (4, 15), [((0, 1), (0, 1))]),  # no inner boundary: one group
        ((7, 11), (1, 7, 11), [((), (0,)), ((0,), (1,)), ((1,), (2,))]),  # equal trailing dims pair 1:1
    ],
)
def test_groups_pair_dims_of_equal_spans(shape: tuple, space: tuple, want: list) -> None:
    got = [(tuple(a), tuple(b)) for a, b in _groups(shape, space)]
    assert got == want


class _Qkv(torch.nn.Module):
    def __init__(self, d: int, heads: int, hd: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, hd
        self.proj = torch.nn.Linear(d, 3 * heads * hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return torch.relu(self.proj(x).view(b, t, 3, self.heads, self.hd)).permute(2, 0, 3, 1, 4)


@pytest.mark.parametrize(("b", "t", "d", "heads", "hd"), [(2, 16, 64, 4, 16), (1, 7, 13, 3, 5), (3, 1, 8, 1, 7)])
def test_qkv_view_bias_is_contiguous_and_matches_eager(b: int, t: int, d: int, heads: int, hd: int) -> None:
    torch.manual_seed(0)
    m, x = _Qkv(d, heads, hd).eval(), torch.randn(b, t, d)
    with torch.no_grad():
        compiled = vfuse.compile(m, (x,), backend="cpp")
        torch.testing.assert_close(compiled(x), m(x))
    src = _source(compiled)
    # The bias (the epilogue's first extra) is read at the output column, no div/mod of it.
    reads = re.findall(r"vg_e0\[([^\]]*)\]", src)
    assert reads and all("%" not in r and "/" not in r for r in reads), reads


def test_merged_view_of_a_batched_matmul_matches_eager() -> None:
    torch.manual_seed(1)
    a, w, bias = torch.randn(3, 5, 7), torch.randn(3, 7, 11), torch.randn(5 * 11)

    def fn(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.bmm(a, w).reshape(3, 55) + bias)

    compiled = vfuse.compile(fn, (a, w, bias), backend="cpp")
    torch.testing.assert_close(compiled(a, w, bias), fn(a, w, bias))
