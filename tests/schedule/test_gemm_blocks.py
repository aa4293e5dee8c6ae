"""GEMM cache blocks are the schedule's (schedule/blocks.py): at fixed sizes `choose_blocking`'s,
over a symbolic M one piece per regime, picked per call by the driver. Each piece must behave as
`choose_blocking` at every M it serves (same KC and NC, as many MC row blocks), and a dynamic
build must compute eager's numbers on both sides of every limit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sympy
import torch
from torch.export import Dim
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

import vfuse
from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.ir.sym import SymEnv, SymSize
from vfuse.schedule.blocks import call_blocks, choose_blocking
from vfuse.schedule.microtile import VectorUnit

CACHES = [(32 << 10, 512 << 10, 32 << 20), (48 << 10, 1 << 20, 32 << 20)]  # Zen 3, Zen 4


def _m(lo: int = 1, hi: int = 1 << 16) -> SymSize | int:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    return SymEnv({s0: (64, ValueRanges(lo, hi))}).size(s0)


@pytest.mark.parametrize("caches", CACHES)
@pytest.mark.parametrize(("n", "k", "micro", "lanes"), [(4096, 1024, (6, 16), 8), (1000, 3000, (14, 32), 16),
                                                         (7, 64, (6, 16), 8), (4096, 2000, (4, 24), 8)])  # fmt: skip
def test_each_piece_behaves_as_the_static_blocks(caches: tuple[int, int, int], n: int, k: int,
                                                 micro: tuple[int, int], lanes: int) -> None:  # fmt: skip
    unit = VectorUnit(lanes)
    c = call_blocks(_m(), n, k, caches, micro, unit)
    assert len(c.upto) == len(c.blocks) - 1 and list(c.upto) == sorted(c.upto)
    for m in [*range(1, 400), *range(400, 20000, 37), *(t + d for t in c.upto for d in (-1, 0, 1))]:
        piece = next((b for t, b in zip(c.upto, c.blocks, strict=False) if m <= t), c.blocks[-1])
        static = choose_blocking(m, n, k, *caches, micro=micro, unit=unit)
        assert (piece.kc, piece.nc, piece.mr, piece.nr) == (static.kc, static.nc, static.mr, static.nr), m
        assert piece.mc % piece.mr == 0 and -(-m // piece.mc) == -(-m // static.mc), (m, piece, static)


def test_fixed_sizes_and_one_regime_keep_the_blocks_at_the_size() -> None:
    unit, caches = VectorUnit(8), CACHES[0]
    fixed = call_blocks(2048, 4096, 1024, caches, (6, 16), unit)
    assert fixed.blocks == (choose_blocking(2048, 4096, 1024, *caches, micro=(6, 16), unit=unit),)
    small = call_blocks(_m(1, 100), 4096, 1024, caches, (6, 16), unit)  # one regime over the range
    assert small.upto == () and len(small.blocks) == 1
    assert len(call_blocks(_m(), 4096, 1024, caches, (6, 16), unit).blocks) > 1
    unbounded = call_blocks(_m(1, int_oo), 4096, 1024, caches, (6, 16), unit)  # Dynamo's default range
    assert len(unbounded.blocks) > 1


def _gelu_mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w + b)


def _bf16_mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (x @ w + b).to(torch.bfloat16)  # partial sums in a workspace when K takes several blocks


@pytest.mark.parametrize("fn", [_gelu_mm, _bf16_mm])
def test_dynamic_gemm_picks_its_blocks_per_call(fn: Callable[..., torch.Tensor]) -> None:
    """One build, first called at 64 rows: every row count on both sides of the limits equals
    eager, and the driver tests M for the blocks that differ."""
    w, b = torch.randn(1024, 300) / 32, torch.randn(300)
    dims = {"x": {0: Dim("rows", min=1, max=1 << 16)}, "w": None, "b": None}
    compiled = vfuse.compile(fn, (torch.randn(64, 1024), w, b), dynamic_shapes=dims, backend="cpp")
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    src = compiler.render(program, Context(Options.from_env()))
    assert "// blocks per call: " in src and " <= " in src[src.index("pc < 1024; pc += ") :].split("\n")[0]
    for m in (1, 7, 64, 100, 167, 168, 169, 257, 700, 1500):
        x = torch.randn(m, 1024)
        want, tol = fn(x, w, b), (1e-4 if fn is _gelu_mm else 1e-2)
        torch.testing.assert_close(compiled(x, w, b).float(), want.float(), rtol=tol, atol=tol)


def test_rows_first_where_a_packed_once_b_fits_half_an_l2() -> None:
    """Threads split M before N (`rows_first`) only for a B packed once that fits half an L2."""
    from vfuse.schedule.blocks import rows_first

    l2 = 2 << 20
    assert rows_first(256, 1024, True, l2)  # BERT's output dense: 1 MiB
    assert not rows_first(4096, 1024, True, l2)  # 16 MiB: each thread reads half from memory
    assert not rows_first(256, 1024, False, l2)  # packed per call: each thread packs half
    assert not rows_first(_m(), 256, True, l2)


def test_a_frozen_linear_splits_rows_with_eagers_numbers() -> None:
    """A frozen Linear(256, 128) over 256 rows (B 128 KiB, within half of any L2 we meet): rows
    first in its program, eager's numbers."""
    torch.set_num_threads(2)
    lin = torch.nn.Linear(256, 128).eval()
    x = torch.randn(256, 256)
    with torch.no_grad():
        c = vfuse.compile(lin, (x,), freeze=True)
        (k,) = [k for k in c.compiled.executor.program.kernels if getattr(k, "gemm_blocks", None)]
        assert k.gemm_blocks.rows_first and "rows first (schedule)" in c.compiled.executor.source
        torch.testing.assert_close(c(x), lin(x), rtol=1e-4, atol=1e-4)
