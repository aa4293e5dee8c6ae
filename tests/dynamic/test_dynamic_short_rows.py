"""Rows of a length known at run time only (strategy.run_time_chains, strategy.row_stack): the
generic row kernel accumulates in lanes of one vector or more, then whole vectors, then one
masked vector (`Reduction.vector`; codegen/cpp/lanes.py), and keeps its row buffers on the stack
where the call's row fits (`Kernel.row_stack`), else allocates them. Checked against eager at
lengths around the vector width and the lane groups, primes, 1, 2, a row longer than the stack
storage and one split between threads, on one and two threads, at every instruction-set tier
this CPU runs; and the structure: the generic kernel takes that accumulation and storage."""

from __future__ import annotations

import pytest
import torch
from tests.dynamic.row_chain import RowChain, check_lengths
from tests.kernel_families import tiers_here

import vfuse
from vfuse.schedule.kernel import Accumulate, Kernel, Program
from vfuse.schedule.strategy import LANE_VECTORS, PARALLEL_MIN
from vfuse.targets import get_target

TIERS = [t.value for t in tiers_here()]
# 1 and 2, primes, around 4 / 8 / 16 lanes and 4 x 16 lane groups, past the stack storage of
# RowChain's buffers (1024 elements each), and a row split between threads.
LENGTHS = (1, 2, 3, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 97, 127, 129, 300, 1024, 1031, PARALLEL_MIN + 13)


class Centered(torch.nn.Module):
    """Cheap bodies (sums of loads, products, differences): several chains of lanes. Two rows of
    a symbolic length: the row walk, its buffers inside the threads' region."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x - x.mean(-1, keepdim=True)
        return c * (c * c).mean(-1, keepdim=True) + x.sum(-1, keepdim=True)


def _generic(rendered: list[tuple[Program, str]], symbolic: bool = True) -> tuple[Kernel, str]:
    # One build serves every size (Dynamo compiles length 1 on its own, fixed).
    ((program, source),) = [(p, s) for p, s in rendered if bool(p.symbols) is symbolic]
    (k,) = [k for k in program.kernels if isinstance(k, Kernel)]
    return k, source


def _lanes(isa: str) -> int:
    return get_target("cpu", isa=isa).simd_lanes


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", TIERS)
def test_run_time_rows_against_eager(rendered: list[tuple[Program, str]], isa: str, threads: int) -> None:
    c = torch.compile(RowChain(), backend=vfuse.backend(strict=True, isa=isa), dynamic=True)
    check_lengths(c, (49, *LENGTHS, 49), threads, atol=1e-5)
    k, source = _generic(rendered)
    vector = _lanes(isa)
    reductions = [p.reduction for p in k.passes if p.reduces]
    assert len(reductions) == 3
    # tanh bodies: one chain, whole vectors then the masked one.
    assert all(r.kind is Accumulate.LANES and r.lanes == r.vector == vector for r in reductions), reductions
    body = source[source.index(f"static void {k.name}_any(") :]
    assert body.count("if (lb + c < re) {") == 2 * 3  # each pass's masked step, and in its serial copy
    assert f"for (; lb + {vector} <= re; lb += {vector}) {{" in body
    # Row buffers: stack storage where the call's row fits, else allocated.
    assert k.row_stack == 8192 and k.at_hint is not None and k.at_hint.kernel.row_stack == 0
    assert body.count("[8192];") >= 3 and "<= 8192 ? (float*)rb_" in body and "std::free(rb_" in body


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", TIERS)
def test_cheap_rows_take_chains_of_lanes(rendered: list[tuple[Program, str]], isa: str, threads: int) -> None:
    m = Centered()
    c = torch.compile(Centered(), backend=vfuse.backend(strict=True, isa=isa), dynamic=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for n in (300, *LENGTHS[1:-1], 5000, 300):  # 1: Dynamo compiles it on its own
                x = torch.randn(2, n, generator=torch.Generator().manual_seed(n))
                torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    k, source = _generic(rendered)
    vector = _lanes(isa)
    reductions = [p.reduction for p in k.passes if p.reduces]
    assert reductions and all(r.kind is Accumulate.LANES and r.vector == vector for r in reductions), reductions
    # The hint (300) spans two groups of LANE_VECTORS vectors up to 16 lanes.
    assert max(r.lanes for r in reductions) == LANE_VECTORS * vector
    groups = LANE_VECTORS * vector
    assert f"for (; lb + {groups} <= re; lb += {groups}) {{" in source
    assert f"for (; lb + {vector} <= re; lb += {vector}) {{" in source and "if (lb + c < re) {" in source


def test_fixed_lengths_are_unchanged(rendered: list[tuple[Program, str]]) -> None:
    """A static build keeps its allocated row buffers and its constant-length accumulation."""
    m = RowChain()
    c = torch.compile(RowChain(), backend=vfuse.backend(strict=True), dynamic=False)
    check_lengths(c, (64,), 1, atol=1e-5)
    k, source = _generic(rendered, symbolic=False)
    assert k.row_stack == 0 and "if (lb + c < re)" not in source and "_st[" not in source
    assert all(p.reduction.vector == 0 for p in k.passes if p.reduction.kind is Accumulate.LANES)
    del m
