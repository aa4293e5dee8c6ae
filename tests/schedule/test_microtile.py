"""Register tiles of the contraction kernels per vector unit (schedule/microtile.py), and that the
schedule gives each contraction kernel the tile of the target's tier."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.schedule.kernel import ContractionKernel
from vfuse.schedule.microtile import (
    AVX512,
    VectorUnit,
    attention_tile,
    micro_tiles,
    pick_micro_tile,
    vector_unit,
)
from vfuse.schedule.printer import format_program
from vfuse.targets.cpu import machine_flags
from vfuse.targets.isa import LANES, VECTOR_REGS, Isa, machine_arch, missing_flags

UNITS = [VectorUnit(16, 32), VectorUnit(8, 16), VectorUnit(4, 32), VectorUnit(4, 16), VectorUnit(8, 32)]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: f"{u.lanes}x{u.registers}")
def test_every_tile_fits_the_registers(unit: VectorUnit) -> None:
    for mr, nr in micro_tiles(unit):
        assert nr % unit.lanes == 0
        nv = nr // unit.lanes
        assert mr * nv + nv + 1 <= unit.registers  # accumulators, B vectors, one broadcast
    mr, nr = attention_tile(unit)
    assert nr <= 64 and nr % unit.lanes == 0 and mr * (nr // unit.lanes) + nr // unit.lanes + 1 <= unit.registers


def test_default_tiles_per_tier() -> None:
    assert micro_tiles(AVX512) == ((14, 32), (8, 48), (6, 64))  # the measured AVX-512 tiles, unchanged
    assert micro_tiles(VectorUnit(8, 16))[0] == (6, 16)
    assert micro_tiles(VectorUnit(4, 32))[0] == (8, 12)
    assert attention_tile(AVX512) == (4, 64) and attention_tile(VectorUnit(8, 16)) == (4, 24)


def test_tile_avoids_padding() -> None:
    assert pick_micro_tile(64, 3136) == (8, 48)  # 64 channels: 14 rows would pad 9%
    assert pick_micro_tile(2048, 4096) == (14, 32)
    assert pick_micro_tile(64, 64, VectorUnit(8, 16)) == (6, 16)  # 66 rows: 3% padding, not worth 4x24
    assert pick_micro_tile(64, 48, VectorUnit(8, 16)) == (4, 24)  # no padding at all
    # AVX-512's 6x64 is 8 % slower than 14x32 at equal padding: 3 % (256 rows) or 6 % (128) less is no gain.
    assert pick_micro_tile(256, 256) == pick_micro_tile(128, 512) == (14, 32)


def test_direct_conv_tiles() -> None:
    avx2 = VectorUnit(8, 16)
    assert micro_tiles(avx2, direct_conv=True)[0] == (4, 24)  # fewer loads per FMA than 6x16 there
    assert pick_micro_tile(64, 3192, avx2, direct_conv=True) == (4, 24)
    assert pick_micro_tile(30, 3192, avx2, direct_conv=True) == (6, 16)  # 4x24 would compute 32 rows
    assert micro_tiles(AVX512, direct_conv=True) == micro_tiles(AVX512)  # no conv table: the GEMM order
    assert pick_micro_tile(48, 4800, avx2, direct_conv=True) == (4, 24)  # both exact: the conv's order
    assert pick_micro_tile(48, 480, avx2, direct_conv=True) == (6, 16)  # small planes: the GEMM order


def test_conv_kernels_get_the_direct_conv_tile() -> None:
    """The schedule plans a stride-1 3x3 with the direct conv's tiles (and at its padded-width columns),
    a strided conv and a pointwise 1x1 with the GEMM's."""
    if Isa.AVX2 not in _tiers():
        pytest.skip("needs an AVX2 CPU")
    x = torch.randn(1, 8, 47, 47)  # 2303 padded-width columns: a plane large enough for the conv's order
    ws = (torch.randn(64, 8, 3, 3), torch.randn(64, 8, 3, 3), torch.randn(64, 8, 1, 1))

    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.conv2d(x, a, padding=1), F.conv2d(x, b, stride=2, padding=1), F.conv2d(x, c)

    compiled = vfuse.compile(fn, (x, *ws), backend="cpp", isa="avx2")
    tiles = [(k.mr, k.nr) for k in compiled.compiled.executor.program.kernels if isinstance(k, ContractionKernel)]
    avx2 = VectorUnit(8, 16)
    assert tiles == [(4, 24), pick_micro_tile(64, 576, avx2), pick_micro_tile(64, 2209, avx2)] != [(4, 24)] * 3
    for got, want in zip(compiled(x, *ws), fn(x, *ws), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_units_without_cpu_vectors_plan_as_avx512() -> None:
    assert vector_unit(32, 255) == AVX512  # a GPU preset's warp and registers
    assert vector_unit(8, 16) == VectorUnit(8, 16)


def _tiers() -> list[Isa]:
    return [t for t in Isa if not missing_flags(t, machine_flags(), machine_arch())]


@pytest.mark.parametrize("tier", _tiers(), ids=lambda t: t.value)
def test_contraction_kernels_get_the_tiers_tile(tier: Isa) -> None:
    unit = VectorUnit(LANES[tier], VECTOR_REGS[tier])
    x, w, q = torch.randn(30, 20), torch.randn(50, 20), torch.randn(1, 2, 9, 8)

    def fn(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.relu(F.linear(x, w)), F.scaled_dot_product_attention(q, q, q)

    compiled = vfuse.compile(fn, (x, w, q), backend="cpp", isa=tier.value)
    kernels = [k for k in compiled.compiled.executor.program.kernels if isinstance(k, ContractionKernel)]
    tiles = {k.op.value: (k.vector, k.mr, k.nr) for k in kernels}
    assert tiles == {
        "matmul": (unit.lanes, *pick_micro_tile(30, 50, unit)),
        "sdpa": (unit.lanes, *attention_tile(unit)),
    }
    listing = format_program(compiled.compiled.executor.program)  # 05_program.txt shows the decision
    assert f"register tile {tiles['matmul'][1]}x{tiles['matmul'][2]} of {unit.lanes}-lane vectors" in listing
    for got, want in zip(compiled(x, w, q), fn(x, w, q), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
