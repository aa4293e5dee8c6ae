"""Row prefetch on cores with a small L2 (schedule/prefetch.py `SMALL_L2`): 1024-wide rows of
softmax, RMSNorm and LayerNorm prefetch rows ahead in 3/4 of a 32 KiB L1 where a 1 MiB L2's core
keeps the half-of-L1 rule (none); there, prefetched row walks whose storing pass is cheap stream
their stores once loads and stores move 2 LLCs (`strategy.stream_prefetched_rows`). The kernels match
eager at every tier this CPU runs, at row lengths that are primes, a multiple of the vector plus a
tail, and fewer rows than the distance."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.codegen import native_helpers
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import check, hand_plan
from tests.fusion.fusion_patterns import FIXED_CPU
from tests.kernel_families import tiers_here

from vfuse.schedule import build
from vfuse.schedule.kernel import Accumulate, Kernel, Reduction
from vfuse.schedule.strategy import FIRST_CHAINS
from vfuse.targets import get_target
from vfuse.targets.isa import Isa

ZEN3 = dataclasses.replace(FIXED_CPU, simd_lanes=8, l1_bytes=32 << 10, l2_bytes=512 << 10)


def _kernel(kind: str, n: int, d: int, target: object) -> Kernel:
    graph, _ = norm_graph(kind, n, d)
    prog = build(hand_plan(graph, [[x.name for x in graph.compute_nodes]]), target)
    (k,) = [k for k in prog.kernels if isinstance(k, Kernel)]
    return k


def test_small_l2_prefetches_rows_in_three_quarters_of_l1() -> None:
    # softmax keeps x's, its row buffer's and the output's rows (12 KiB): 3 rows ahead fit in 24 KiB;
    # LayerNorm's x, weight, bias and output (16 KiB) leave room for 2; its mean pass then takes
    # FIRST_CHAINS chains (a prefetched first pass).
    assert _kernel("softmax", 8192, 1024, ZEN3).prefetch.distance == 3
    assert _kernel("rms", 8192, 1024, ZEN3).prefetch.distance == 3
    ln = _kernel("layernorm", 8192, 1024, ZEN3)
    assert ln.prefetch.distance == 2
    assert ln.passes[0].reduction == Reduction(Accumulate.STRIPS, 1024, chains=FIRST_CHAINS, vector=8)
    # A 1 MiB L2 (Zen 4) or an unknown one: half of L1, no room for 2 rows ahead.
    for l2 in (1 << 20, 0):
        for kind in ("softmax", "rms", "layernorm"):
            assert _kernel(kind, 8192, 1024, dataclasses.replace(ZEN3, l2_bytes=l2)).prefetch is None
    # Rows of 2048 floats (8 KiB each) fill the room on their own.
    assert _kernel("softmax", 4096, 2048, ZEN3).prefetch is None


def test_prefetched_rows_with_a_cheap_storing_pass_stream_from_two_llcs() -> None:
    # softmax 8192x1024 reads 32 MiB and writes 32 MiB: 2 LLCs of 32 MiB; its last pass multiplies
    # by 1/sum. 4096 rows move 1 LLC; LayerNorm's last pass has a GELU; unprefetched rows (1 MiB
    # L2) keep their stores cached.
    sm = _kernel("softmax", 8192, 1024, ZEN3)
    assert sm.stream and [p.streamed for p in sm.passes] == [False, False, True]
    assert not _kernel("softmax", 4096, 1024, ZEN3).stream
    assert not _kernel("layernorm", 8192, 1024, ZEN3).stream
    assert not _kernel("softmax", 8192, 1024, dataclasses.replace(ZEN3, l2_bytes=1 << 20)).stream
    # Prefetched rows on a core with a larger L2 (48 KiB L1, 1 MiB L2: Zen 5) keep their stores cached.
    zen5 = _kernel("softmax", 8192, 1024, dataclasses.replace(ZEN3, l1_bytes=48 << 10, l2_bytes=1 << 20))
    assert zen5.prefetch is not None and not zen5.stream


@pytest.fixture
def _small_l2(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    tier: Isa = request.param
    # An LLC of 4 KiB: these small rows stream where the rule lets them.
    cpu = dataclasses.replace(get_target("cpu", isa=tier), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=4 << 10)
    monkeypatch.setattr(native_helpers, "target", lambda: cpu)


@pytest.mark.parametrize("_small_l2", tiers_here(), ids=lambda t: t.value, indirect=True)
@pytest.mark.parametrize("kind", ["softmax", "rms", "layernorm"])
@pytest.mark.parametrize(("n", "d"), [(1, 1031), (2, 521), (3, 1024), (13, 1019)])
def test_prefetched_rows_match_eager(_small_l2: None, kind: str, n: int, d: int) -> None:
    # Rows of at least 2 KiB are prefetched (the last rows clamp the prefetch to the last row);
    # 521 and 1019 are primes (tails after the strips), 2 rows fewer than the distance; one row has
    # no row loop and nothing to prefetch.
    graph, eager = norm_graph(kind, n, d)
    gen = torch.Generator().manual_seed(n * d)
    xs = [torch.randn(n, d, generator=gen) * 3 + 1, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    ex = check(graph, xs, hand_plan(graph, [[x.name for x in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert (k.prefetch is not None and "__builtin_prefetch" in ex.source) == (n > 1)
    if kind != "layernorm":  # (LayerNorm's stores stream by nest.with_streaming's rule at this LLC)
        assert ("vf_stream(&" in ex.source) == (n > 1)
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)
