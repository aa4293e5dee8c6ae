"""A GEMM whose A is read transposed (a weight gradient dY^T @ X): the schedule runs all of M in one
row block with K in blocks that keep the A block about half of L2 (schedule/transposed_a.py), from
the target's caches; the A block packer prefetches later K steps through the prologue's addresses
(codegen/cpp/gemm/prologue.py). Numerics against eager where one block applies, at its KC floor,
past it (M too large: `choose_blocking` decides) and at thread counts that split the columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.aarch64.cross import missing_tools, run_arm64

import vfuse
from vfuse.compiler import optimize, plan, render, schedule
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.frontend.lower import lower
from vfuse.schedule.kernel import ContractionKernel
from vfuse.schedule.microtile import VectorUnit
from vfuse.schedule.transposed_a import MIN_KC, l1_kc, transposed_a, transposed_a_blocks
from vfuse.targets import get_target
from vfuse.targets.cpu import at_tier
from vfuse.targets.isa import ARM, CpuIsa, Isa


def _wgrad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.t() @ b


def _compiled(k: int, m: int, n: int, tmp_path: Path, threads: int = 1) -> tuple[torch.Tensor, object]:
    g = torch.Generator().manual_seed(k * 7919 + m * 31 + n)
    dy, x = torch.randn(k, m, generator=g), torch.randn(k, n, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    backend = vfuse.backend(strict=True, cache_dir=tmp_path)
    try:
        got = torch.compile(_wgrad, backend=backend, dynamic=False)(dy, x)
    finally:
        torch.set_num_threads(old)
    want = (dy.double().t() @ x.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, k**0.5))
    (compiled,) = backend.compiled
    return got, compiled


def _kernel(compiled: object) -> ContractionKernel:
    program = compiled.executor.program  # type: ignore[attr-defined]
    (kernel,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    return kernel


@pytest.mark.parametrize(
    ("k", "m", "n", "threads"),
    [(2048, 257, 1031, 1), (2048, 257, 1031, 2), (1500, 1023, 40, 3), (700, 2003, 37, 2), (900, 4001, 17, 1)],
)
def test_transposed_a_matches_eager(k: int, m: int, n: int, threads: int, tmp_path: Path) -> None:
    """One row block (257, 1023 rows), near the KC floor (2003 rows), past it (4001 rows on a
    512 KB L2: `choose_blocking`'s blocks); prime N with a partial last sliver; 1-3 threads."""
    _compiled(k, m, n, tmp_path, threads)


def test_schedule_puts_m_in_one_block_from_the_targets_caches(tmp_path: Path) -> None:
    """The blocks follow the caches the kernel carries (the target's), not this machine's: a
    larger L2 takes a longer KC, a smaller L1 caps it, and an L2 too small for MIN_KC leaves
    `choose_blocking`'s blocks (several row blocks)."""
    _, compiled = _compiled(1200, 250, 64, tmp_path)
    k = _kernel(compiled)
    assert transposed_a(k)
    tile, unit = (k.mr, k.nr), VectorUnit(k.vector)
    mpad = -(-250 // k.mr) * k.mr
    kcs = {}
    for caches in [(32 << 10, 512 << 10, 32 << 20), (48 << 10, 2 << 20, 32 << 20), (16 << 10, 2 << 20, 8 << 20)]:
        (b,) = transposed_a_blocks(dataclasses.replace(k, caches=caches), tile, unit).gemm_blocks.blocks
        assert b.mc >= mpad, (caches, b)  # all of M in one row block
        assert MIN_KC <= b.kc <= l1_kc(caches[0], b.nr) and b.kc % 16 == 0
        assert mpad * b.kc * 4 <= caches[1] // 2 + mpad * 8 * 4  # the A block about half of L2
        kcs[caches] = b.kc
    assert kcs[(48 << 10, 2 << 20, 32 << 20)] > kcs[(32 << 10, 512 << 10, 32 << 20)]
    assert kcs[(16 << 10, 2 << 20, 8 << 20)] < kcs[(48 << 10, 2 << 20, 32 << 20)]
    tiny = dataclasses.replace(k, caches=(32 << 10, 32 << 10, 32 << 20))
    assert transposed_a_blocks(tiny, tile, unit) is tiny


def test_a_block_packer_prefetches_later_k_steps(tmp_path: Path) -> None:
    """The block packer asks for the run K steps ahead at the prologue's own address expression."""
    _, compiled = _compiled(300, 61, 19, tmp_path)
    source = compiled.executor.source  # type: ignore[attr-defined]
    packer = source[source.index("_pack_a(long b") :]
    packer = packer[: packer.index("\n}\n")]
    assert "__builtin_prefetch(&vg_e0[r + 61 * c], 0, 3);" in packer
    assert "k0 + kk + 8" in packer


@pytest.mark.aarch64
@pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))
def test_transposed_a_on_arm64(tmp_path: Path) -> None:
    """One row block over several K blocks and the prefetching block packer, cross-compiled for
    ARM64 (4 fp32 lanes, NEON's register tile) and run under qemu."""
    g = torch.Generator().manual_seed(5)
    # 13 x 24: rows off NEON's 8 x 12 tile; a 13 x 7 output padded to 2.1x its flops sat level with
    # torch's call in the cost model (a Zen 4's measured figures sent it to torch).
    inputs = (torch.randn(1100, 13, generator=g), torch.randn(1100, 24, generator=g))
    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(_wgrad, inputs).graph_module, ctx), ctx)
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset(), ARM))
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    (kernel,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    (b,) = kernel.gemm_blocks.blocks
    assert b.mc >= 13 and b.kc < 1100, b
    source = render(program, ctx)
    assert "__builtin_prefetch(&" in source
    got = run_arm64(program, graph, source, inputs, [], tmp_path)[graph.outputs[0]]
    torch.testing.assert_close(got, _wgrad(*inputs), rtol=1e-4, atol=1e-3)
