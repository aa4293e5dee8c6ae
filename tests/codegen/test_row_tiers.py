"""Row kernels (softmax, RMSNorm + SiLU, LayerNorm) at every instruction-set tier, against eager, at
row lengths that are 1, primes and no multiple of 8 or 16: the prelude's exp / SiLU and each tier's
walks (strips with several chains in an unprefetched first pass at 8 lanes, row groups, lanes)
with their partial vectors and remainders."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.kernel_families import tiers_here

import vfuse
from vfuse.targets.isa import Isa

LENGTHS = (1, 7, 17, 97, 256, 263, 1000, 1031)
ROWS = 11  # several row groups of 4 and a partial one


def _rows(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = []
    for x in xs:
        w = torch.linspace(0.5, 1.5, x.shape[-1])
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        out += [torch.softmax(x * 3.0, -1), F.silu(rms), F.layer_norm(x, x.shape[-1:], w, w - 1.0)]
    return tuple(out)


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
def test_row_kernels_match_eager_at_odd_lengths(tier: Isa) -> None:
    gen = torch.Generator().manual_seed(0)
    xs = tuple(torch.randn(ROWS, n, generator=gen) * 2 + 0.5 for n in LENGTHS)
    compiled = vfuse.compile(_rows, xs, backend="cpp", isa=tier.value)
    source = compiled.compiled.executor.source
    assert "vf_silu(" in source and "vf_exp_nonpos(" in source  # the kernels, not a fallback
    if tier is Isa.AVX2:
        assert "_q1 = (float)0;" in source  # some first pass takes two chains
    for got, want in zip(compiled(*xs), _rows(*xs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
def test_row_groups_with_prefetch_match_eager(tier: Isa) -> None:
    # Inputs of 1 MiB and more in rows of 1 KiB prefetch rows ahead in each pass of a row group (the
    # last rows' prefetch clamped to the last row); 1101 rows: a partial last group. 251: none.
    gen = torch.Generator().manual_seed(1)
    xs = tuple(torch.randn(1101, n, generator=gen) * 2 + 0.5 for n in (256, 251))
    compiled = vfuse.compile(_rows, xs, backend="cpp", isa=tier.value)
    source = compiled.compiled.executor.source
    # RMSNorm + SiLU's 2 passes and LayerNorm's 3 (softmax walks rows); at AVX-512 LayerNorm's 256-wide
    # rows are held in registers (`Kernel.register_row`), one row at a time: its row ahead defined once.
    held = tier is Isa.AVX512
    assert source.count("i0_pf = ") == (3 if held else 5) and source.count("__builtin_prefetch") == 5
    assert ("typedef float vr_t" in source) == held
    for got, want in zip(compiled(*xs), _rows(*xs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
