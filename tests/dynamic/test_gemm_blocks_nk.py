"""GEMM cache blocks over a symbolic K or N (schedule/blocks.py `_nk_pieces`): chosen per call from
a small set, not at the hints. Hinted at K = 49, a call at K = 2048 ran K in 42 blocks of 49 (a
pass over C each; 1.40x a static build at 256 x 2048 x 2048, one thread). Each call's piece must
stay close to `choose_blocking` at the call's own sizes whatever the hint, and a dynamic build
must compute eager's numbers on both sides of every limit."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import sympy
import torch
from torch.export import Dim
from torch.utils._sympy.value_ranges import ValueRanges

import vfuse
from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.ir.sym import SymEnv
from vfuse.schedule.blocks import Blocking, CallBlocks, call_blocks, choose_blocking
from vfuse.schedule.microtile import VectorUnit

CACHES = [(32 << 10, 512 << 10, 32 << 20), (48 << 10, 1 << 20, 32 << 20)]  # Zen 3, Zen 4
S0, S1 = (sympy.Symbol(f"s{i}", integer=True, positive=True) for i in range(2))


def _env(hint: int) -> SymEnv:
    return SymEnv({S0: (hint, ValueRanges(1, 1 << 16)), S1: (hint, ValueRanges(1, 1 << 16))})


def _piece(c: CallBlocks, m: int, k: int) -> Blocking:
    """The piece the driver's tests pick (codegen/cpp/gemm/driver.py `_block`)."""
    for b, (tm, tk) in zip(c.blocks, c.within, strict=True):
        if (tm is None or m <= tm) and (tk is None or k <= tk):
            return b
    raise AssertionError("no piece for every call")


@pytest.mark.parametrize("caches", CACHES)
@pytest.mark.parametrize(("micro", "lanes"), [((6, 16), 8), ((14, 32), 16), ((4, 24), 8)])
@pytest.mark.parametrize("n", [7, 1000, None])  # None: N = M, symbolic
@pytest.mark.parametrize("sym_m", [False, True])
def test_each_call_gets_blocks_near_the_static_ones_whatever_the_hint(
    caches: tuple[int, int, int], micro: tuple[int, int], lanes: int, n: int | None, sym_m: bool
) -> None:
    unit = VectorUnit(lanes)
    made = []
    for hint in (49, 2048):  # the pieces do not depend on the hint
        env = _env(hint)
        m_size = env.size(S0) if sym_m else 256
        made.append(call_blocks(m_size, env.size(S0) if n is None else n, env.size(S1), caches, micro, unit))
    c = made[0]
    assert (c.blocks, c.within) == (made[1].blocks, made[1].within) and c.upto == ()
    assert len(c.blocks) <= 16 and c.within[-1] == (None, None)
    for m in [1, 7, 49, 167, 169, 1000, 20000] if sym_m else [256]:
        for k in [1, 49, 65, 191, 193, 385, 700, 1280, 1281, 2048, 5000]:
            b, static = _piece(c, m, k), choose_blocking(m, m if n is None else n, k, *caches, micro=micro, unit=unit)
            assert (b.mr, b.nr) == (static.mr, static.nr) and b.mc % b.mr == 0 and b.nc % b.nr == 0
            assert math.ceil(k / b.kc) <= math.ceil(k / static.kc) + 1, (m, k, b, static)  # passes over C
            if k > 64:  # below, A and the B panel are small whatever MC
                assert math.ceil(m / b.mc) <= 2 * math.ceil(m / static.mc) + 2, (m, k, b, static)  # MR rounding


def test_fixed_k_and_a_symbolic_n_take_one_piece_at_nc_s_cap() -> None:
    unit, caches, env = VectorUnit(8), CACHES[0], _env(49)
    c = call_blocks(256, env.size(S0), 1024, caches, (6, 16), unit)
    assert c.blocks == (choose_blocking(256, 1 << 16, 1024, *caches, micro=(6, 16), unit=unit),)
    assert call_blocks(256, 300, 1024, caches, (6, 16), unit).within == ()  # fixed sizes: as before


def _relu_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b)


def _bf16_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a @ b + 1).to(torch.bfloat16)  # partial sums in a workspace when K takes several blocks


@pytest.mark.parametrize("fn", [_relu_mm, _bf16_mm])
def test_dynamic_k_and_n_pick_their_blocks_per_call(fn: Callable[..., torch.Tensor]) -> None:
    """One build hinted at 49: every K on both sides of the limits (and N past one panel) equals eager."""
    k, n = Dim("k", min=1, max=1 << 16), Dim("n", min=1, max=1 << 16)
    dims = {"a": {1: k}, "b": {0: k, 1: n}}
    compiled = vfuse.compile(fn, (torch.randn(37, 49), torch.randn(49, 49)), dynamic_shapes=dims, backend="cpp")
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    src = compiler.render(program, Context(Options.from_env()))
    assert "// blocks per call: " in src and "(M, K) within" in src
    for kk, nn in ((1, 5), (49, 49), (63, 200), (385, 17), (769, 3), (1281, 33), (2048, 1500), (2600, 9)):
        a, b = torch.randn(37, kk), torch.randn(kk, nn) / math.sqrt(kk)
        tol = 1e-4 if fn is _relu_mm else 1e-2
        torch.testing.assert_close(compiled(a, b).float(), fn(a, b).float(), rtol=tol, atol=tol)
