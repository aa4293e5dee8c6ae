"""The small row graph of the dynamic overhead tests: the bench's tiny_graph form (pointwise ops
and row means on short rows), fewer iterations, and the loop that checks a compiled copy against
eager over row lengths on a given number of threads."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class RowChain(torch.nn.Module):
    """tiny_graph's body, fewer iterations: tanh(x*y+0.5) then the row mean subtracted."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(x * y + 0.5)
            x = x - x.mean(-1, keepdim=True)
        return x


def inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def check_lengths(compiled: Callable[..., torch.Tensor], lengths: Iterable[int], threads: int, atol: float) -> None:
    """`compiled` against RowChain in eager at each row length, on `threads` threads."""
    m = RowChain()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for n in lengths:
                x, y = inputs(n)
                torch.testing.assert_close(compiled(x, y), m(x, y), rtol=1e-5, atol=atol)
    finally:
        torch.set_num_threads(before)
