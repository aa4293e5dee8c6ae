"""Weight-gradient GEMMs dY^T @ X through the packers that read whole rows: A = dY^T packed a
K step at a time across a block's slivers (prologue.py `_block_loops`) and a row-major B packed
a panel's slivers row by row (vg_pack_b_rows_span), against eager at odd sizes (M not a multiple
of MR, N not of NR, K past one KC block, several row blocks) and thread counts (the span's
per-thread sliver ranges, the single-block `own` path)."""

from __future__ import annotations

import pytest
import torch

import vfuse

SHAPES = [  # (K, M, N): dY is K x M, X is K x N, the result M x N
    (1, 1, 1),
    (5, 7, 17),
    (37, 13, 33),
    (1300, 61, 19),  # K in two KC blocks
    (600, 131, 259),  # several MC blocks, a partial last sliver
    (2, 300, 1),
    (2050, 257, 1030),  # one pack per row block (no shared A): the block packer across slivers
]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("k", "m", "n"), SHAPES)
def test_wgrad_matches_eager(k: int, m: int, n: int, threads: int) -> None:
    g = torch.Generator().manual_seed(k * 7919 + m * 31 + n)
    dy, x = torch.randn(k, m, generator=g), torch.randn(k, n, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fn = torch.compile(lambda a, b: a.t() @ b, backend=vfuse.backend(strict=True), dynamic=False)
        got = fn(dy, x)
    finally:
        torch.set_num_threads(old)
    want = (dy.double().t() @ x.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, k**0.5))


def test_wgrad_of_a_permuted_view_matches_eager() -> None:
    """dY read through a permute (its rows strided): the block packer's index is the prologue's."""
    g = torch.Generator().manual_seed(3)
    dy, x = torch.randn(11, 4, 29, generator=g), torch.randn(44, 23, generator=g)
    fn = torch.compile(lambda a, b: a.permute(1, 0, 2).reshape(44, 29).t() @ b, backend=vfuse.backend(strict=True))
    want = dy.permute(1, 0, 2).reshape(44, 29).t() @ x
    torch.testing.assert_close(fn(dy, x), want, rtol=1e-4, atol=1e-4)
