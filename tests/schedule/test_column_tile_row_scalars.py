"""Column sums that also read one value per row (a LayerNorm weight gradient `sum(dY * xhat * rstd, 0)`,
hf_bert / hf_gpt2 backward) take the tiled-columns walk: the per-row value is a broadcast in the column
tile (`schedule/strategy.column_tile`). They had walked each column's strided elements: 2.5x eager."""

from __future__ import annotations

import pytest
import torch

import vfuse
from vfuse.schedule.kernel import Kernel, Walk


def _walks(fn: object, *inputs: torch.Tensor) -> list[Walk]:
    g = vfuse.compile(fn, inputs)
    torch.testing.assert_close(g(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)  # type: ignore[operator]
    return [k.walk for k in g.compiled.executor.program.kernels if isinstance(k, Kernel)]


def _gamma_grad(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    return (dy * (x * rstd)).sum((0, 1))


@pytest.mark.parametrize("shape", [(2, 128, 256), (3, 37, 200), (1, 5, 19)])
def test_column_sum_with_a_per_row_scalar_walks_tiled_columns(shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    dy, x, rstd = torch.randn(*shape), torch.randn(*shape), torch.rand(*shape[:-1], 1) + 0.5
    assert _walks(_gamma_grad, dy, x, rstd) == [Walk.TILED_COLUMNS]


@pytest.mark.parametrize("shape", [(1, 1, 33), (1, 2, 1), (4, 1, 7)])
def test_degenerate_column_sums_match_eager(shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    dy, x, rstd = torch.randn(*shape), torch.randn(*shape), torch.rand(*shape[:-1], 1) + 0.5
    assert _walks(_gamma_grad, dy, x, rstd)  # compared with eager inside


def test_a_transposed_operand_still_walks_rows() -> None:
    """A load contiguous along the reduced axis that also moves with the column is a strided read in
    a column tile: the kernel keeps its rows."""
    torch.manual_seed(0)
    a, b = torch.randn(61, 47), torch.randn(47, 61)
    fn = lambda a, b: (a * b.t()).sum(0)  # noqa: E731
    assert Walk.TILED_COLUMNS not in _walks(fn, a, b)
