"""A tiled transpose over symbolic sizes at its hinted size: the kernel's copy for the hint has the
tile's rows as constants, and there g++ -O2 and up dropped the 8x8 block stores that went through
uint32 vectors into the float staging buffer (rows 0..7 of every tile read garbage: wrong values
and NaN; found by make fuzz on a linear -> unflatten -> permute program, session 24)."""

from __future__ import annotations

import torch

import vfuse


def _f(x: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return (x + c).unflatten(2, (2, 8)).permute(0, 2, 3, 1) + d


def test_a_transposed_tile_at_the_hinted_size_matches_eager() -> None:
    torch._dynamo.reset()
    c, d = torch.randn(1, 1), torch.randn(1, 1)
    fn = torch.compile(_f, backend=vfuse.backend(strict=True), dynamic=True)
    for rows, cols, contiguous in [(37, 11, False), (37, 11, True), (5, 11, True), (37, 22, True), (13, 8, True)]:
        x = torch.randn(16, cols, rows).permute(2, 1, 0)
        x = x.contiguous() if contiguous else x
        torch.testing.assert_close(fn(x, c, d), _f(x, c, d))
