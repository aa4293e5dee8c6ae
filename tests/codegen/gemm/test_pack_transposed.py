"""The packers' register transposes (`vg_pack_t<R, W>`, microkernel.py): R rows of a matrix ->
k-major with the R rows innermost, exactly, for every sliver height the tiers use (R a multiple
of W, R below W, R whose last block overlaps the one before), both block widths, and k ranges with and without
a tail; then through the GEMMs that use them (an A sliver, a transposed B's) at each tier."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from tests.kernel_families import tiers_here

import vfuse
from vfuse.codegen.cpp.gemm.microkernel import PACKERS
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.targets.isa import Isa

ROWS = (2, 4, 6, 8, 10, 12, 14, 16, 24, 32, 48, 64)  # the tiles' MRs and NRs (and 2, 10: edge cases)


def _source() -> str:
    calls = "".join(
        f'extern "C" void pack_{r}_{w}(const float* s, long ld, long kc, float* d) '
        f"{{ vg_pack_t<{r}, {w}>(s, ld, kc, d); }}\n"
        for r in ROWS
        for w in (4, 8)
    )
    return render_prelude() + PACKERS + calls


@pytest.mark.parametrize("w", [4, 8])
@pytest.mark.parametrize("r", ROWS)
def test_pack_t_is_an_exact_transpose(build, r: int, w: int) -> None:
    lib = build(_source())
    fn = getattr(lib, f"pack_{r}_{w}")
    for kc in (1, 3, w, w + 3, 37, 64):
        ld = kc + 5  # rows further apart than kc: the packer must read only [0, kc) of each
        src = torch.randn(r, ld)
        dst = torch.full((kc + 1, r), 7.0)  # one row past the end: never written
        fn(ctypes.c_void_p(src.data_ptr()), ctypes.c_long(ld), ctypes.c_long(kc), ctypes.c_void_p(dst.data_ptr()))
        assert torch.equal(dst[:kc], src[:, :kc].T), (r, w, kc)
        assert torch.equal(dst[kc], torch.full((r,), 7.0)), (r, w, kc)


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
@pytest.mark.parametrize(("m", "k", "n"), [(29, 45, 37), (64, 8, 48), (131, 300, 97)])
def test_linear_through_the_packers(m: int, k: int, n: int, tier: Isa) -> None:
    """nn.Linear's weight is a transposed B (vg_pack_b_cols), the input an A packed per block."""
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    compiled = vfuse.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), (x, w, b), strict=True, isa=tier.value)
    torch.testing.assert_close(compiled(x, w, b), F.gelu(F.linear(x, w, b)), rtol=1e-4, atol=1e-4)
