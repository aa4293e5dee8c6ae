"""Tile-size choice, epilogue composition and the source-level contract of the renderers."""

from __future__ import annotations

import pytest

from vfuse.codegen.cpp.gemm import Blocking, ConvSpec, Epilogue, EpilogueArg, GemmSpec, choose_blocking, render_gemm
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.blocking import MICRO_TILES

CACHES = (48 << 10, 1 << 20, 32 << 20)


@pytest.mark.parametrize("mnk", [(2048, 4096, 1024), (16384, 4096, 64), (64, 3136, 576), (7, 5, 3), (512, 512, 8192)])
def test_blocking_fits_caches(mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    b = choose_blocking(m, n, k, *CACHES)
    assert (b.mr, b.nr) in MICRO_TILES
    assert b.mc % b.mr == 0 and b.nc % b.nr == 0
    assert b.kc <= k
    assert b.mc * b.kc * 4 <= CACHES[1]  # A block in L2
    assert b.kc * b.nc * 4 <= CACHES[2] // 2 or b.nc == b.nr  # B panel in (half of) L3


def test_moderate_k_is_one_pass() -> None:
    # One KC block means C is written once, with the epilogue, straight from the micro-kernel.
    assert choose_blocking(2048, 4096, 1024, *CACHES).kc == 1024
    assert choose_blocking(512, 512, 8192, *CACHES).kc < 8192


def test_small_m_keeps_b_sliver_in_l1() -> None:
    # conv 3x3 with 64 channels: one MC block, so K is split to keep the 48-wide sliver in L1.
    b = choose_blocking(64, 3136, 576, *CACHES)
    assert (b.mc, b.kc) == (64, 192) and b.kc * b.nr * 4 <= CACHES[0]


def test_micro_tile_avoids_padding() -> None:
    assert (choose_blocking(64, 3136, 576, *CACHES).mr, choose_blocking(64, 3136, 576, *CACHES).nr) == (8, 48)
    assert choose_blocking(2048, 4096, 1024, *CACHES).mr == 14  # 6x64 pads 0.3% less: not worth it
    assert choose_blocking(2048, 4096, 1024, *CACHES, micro=(6, 64)).mr == 6


def test_bad_blocking_and_names_rejected() -> None:
    with pytest.raises(ValueError):
        Blocking(8, 40, 64, 64, 64)
    with pytest.raises(ValueError, match="identifier"):
        GemmSpec("1bad", 2, 2, 2)
    with pytest.raises(ValueError, match="batch stride"):
        GemmSpec("g", 2, 2, 2, batch=(3,))
    with pytest.raises(ValueError, match="vector registers"):
        render_gemm(GemmSpec("g", 2, 2, 2, blocking=Blocking(16, 48, 16, 2, 48)), E.none())


def test_epilogue_composition() -> None:
    epi = E.bias_relu().then(E.residual_add())
    assert [a.name for a in epi.args] == ["bias", "residual"]
    assert epi.params() == ", const float* __restrict bias, const float* __restrict residual"
    assert epi.names() == ", bias, residual"
    with pytest.raises(ValueError, match="clash"):
        E.bias().then(E.bias_relu())
    custom = Epilogue("clamp", (EpilogueArg("hi", "float"),), ("v = v < hi ? v : hi;",))
    assert custom.params() == ", float hi"


def test_rendered_signature_and_guards() -> None:
    src = render_gemm(GemmSpec("lin", 8, 16, 4, trans_b=True), E.bias_gelu_erf())
    assert 'extern "C" void lin(const float* __restrict A, const float* __restrict B, float* __restrict C, ' in src
    assert "const float* __restrict bias, int nthreads)" in src
    assert src.count("#ifndef VFUSE_GEMM_PRELUDE") == 1
    static = render_gemm(GemmSpec("lin2", 8, 16, 4, linkage="static"), E.none())
    assert "static void lin2(" in static
    conv = ConvSpec("c", 1, 3, 8, 8, 4, 3, 3, padding=(1, 1))
    assert conv.out_hw == (8, 8) and conv.gemm_mnk == (4, 64, 27)
