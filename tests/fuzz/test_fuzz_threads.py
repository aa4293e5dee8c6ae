"""Thread stress: generated kernels at 2 and 3 threads, each compiled graph called many times.

A race between the threads of a generated kernel (a buffer one thread packs while another still
reads it, a barrier some thread skips) shows in some calls only, and only where the work does not
divide evenly: odd batch counts on 2 or 3 threads, a short last column panel, cache blocks chosen
at a small first size and run at larger ones (torch.compile(dynamic=True)). The other fuzz suites
call each kernel once, so they rarely see one (a conv over 5 images of 13 x 17 under dynamic=True,
2 threads, was wrong in ~1 call in 4: tests/codegen/gemm/test_gemm.py
test_own_slivers_across_batch_entries). Here every graph is compared with eager on every call, at
each thread count (vfuse reads torch.get_num_threads() per call, so one build serves both).

`make test` runs the fixed families below and a few drawn batched-GEMM / conv shapes, REPS calls
per size and thread count; `make fuzz` (VFUSE_FUZZ=soak) draws VFUSE_FUZZ_EXAMPLES shapes and calls
each graph SOAK_REPS times.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import fuzz_settings

import vfuse

SOAK = os.environ.get("VFUSE_FUZZ") == "soak"
REPS = 40 if SOAK else 10
THREADS = (2, 3)
DRAWN_EXAMPLES = 3

Inputs = Callable[[tuple[int, ...], torch.Generator], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Family:
    """A graph, its inputs at a size, the sizes it is called at (the first compiles) and how."""

    fn: Callable[..., torch.Tensor]
    inputs: Inputs
    sizes: tuple[tuple[int, ...], ...]
    dynamic: bool
    grad: bool = False
    freeze: bool = False
    tol: float = 1e-4


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _module(m: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    for p in m.parameters():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape) * 0.3)
    return m


def _conv(cin: int, cout: int, kernel: int | tuple[int, int], **kw: int) -> torch.nn.Module:
    return _module(torch.nn.Sequential(torch.nn.Conv2d(cin, cout, kernel, **kw), torch.nn.ReLU()))


def _planes(cin: int) -> Inputs:
    return lambda s, g: (_randn(g, s[0], cin, s[1], s[2]),)


def _bmm(m: int, k: int) -> Inputs:
    # size: (batch, N); one MC block for small M (threads pack their own B slivers).
    return lambda s, g: (_randn(g, s[0], m, k), _randn(g, s[0], k, s[1]))


def _sdpa(causal: bool) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _qkv(heads: int, e: int) -> Inputs:
    return lambda s, g: tuple(_randn(g, s[0], heads, s[1], e) for _ in range(3))


def _rows(s: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (_randn(g, s[0], s[1]),)


_LN = _module(torch.nn.LayerNorm(131))
_LINEAR = _module(torch.nn.Linear(601, 872))
_SMALL_LINEAR = _module(torch.nn.Linear(97, 203))  # B of 77 KiB: rows first (`CallBlocks.rows_first`)

# Odd batches (not a multiple of 2 or 3 and under 4 per thread: the GEMM driver's threads share
# one panel buffer across batch entries), primes, a small first size whose blocks the later sizes
# run under (dynamic), planes and rows past the threading threshold.
FAMILIES = {
    # The CI failure's geometry (implicit GEMM over symbolic planes, NC picked at 7 x 9).
    "conv3x3_dynamic": Family(
        _conv(4, 6, 3, padding=1), _planes(4), ((2, 7, 9), (5, 13, 17), (7, 23, 10), (3, 11, 13)), True
    ),
    "conv_grouped_strided_dynamic": Family(
        _conv(4, 6, (3, 2), stride=2, groups=2), _planes(4), ((2, 9, 11), (5, 29, 31), (3, 17, 13)), True
    ),
    # Fixed sizes: the direct path (padded planes), strided phase planes, grouped.
    "conv3x3_static": Family(_conv(4, 6, 3, padding=1), _planes(4), ((5, 13, 17),), False),
    "conv_strided_static": Family(_conv(3, 8, 3, stride=2, padding=1), _planes(3), ((5, 31, 29),), False),
    "conv_grouped_static": Family(_conv(6, 9, 3, stride=2, groups=3), _planes(6), ((7, 19, 23),), False),
    # One MC block (M 6), N past one column panel with a short last one, odd batches.
    "bmm_dynamic": Family(torch.bmm, _bmm(6, 37), ((3, 61), (5, 1999), (7, 211), (5, 67)), True),
    "bmm_static_panels": Family(torch.bmm, _bmm(6, 37), ((5, 1999),), False),
    "bmm_static_rows": Family(torch.bmm, _bmm(67, 401), ((3, 131),), False),
    "sdpa_causal_dynamic": Family(_sdpa(True), _qkv(3, 16), ((1, 37), (5, 61), (3, 29)), True),
    "sdpa_static": Family(_sdpa(False), _qkv(5, 8), ((1, 67),), False),
    "sdpa_backward": Family(_sdpa(True), _qkv(3, 16), ((1, 37), (5, 29)), True, grad=True),
    # One (batch, head) task: its K tiles split between the threads, dQ summed from their parts.
    "sdpa_backward_split": Family(_sdpa(False), _qkv(1, 8), ((1, 211),), False, grad=True),
    "layernorm_dynamic": Family(_LN, _rows, ((257, 131), (1031, 131), (263, 131)), True),
    "softmax_dynamic": Family(lambda x: torch.softmax(x, -1), _rows, ((131, 257), (523, 257), (131, 1031)), True),
    "full_sum_dynamic": Family(lambda x: x - x.sum() / 4096.0, _rows, ((263, 131), (1031, 257), (131, 263)), True),
    "column_sum_dynamic": Family(lambda x: x.sum(0) * 2.0, _rows, ((1031, 67), (2053, 131), (1021, 37)), True),
    "conv_backward_static": Family(_conv(4, 6, 3, stride=2, padding=1), _planes(4), ((5, 13, 17),), False, grad=True),
    # A frozen weight packed once (prepacked B), K past one K block (partial sums in the shared
    # workspace: an fp16 output), N past a column panel with a short last one, one MC block.
    "linear_frozen_half": Family(
        lambda x: _LINEAR(x).half(), lambda s, g: (_randn(g, s[0], 601),), ((5,), (3,)), False, freeze=True, tol=2e-3
    ),
    # A frozen weight within half an L2 and one MC block: each thread its own rows of A (odd row
    # counts: slivers that do not divide among 2 or 3 threads, fewer slivers than threads at 7).
    "linear_frozen_rows": Family(
        lambda x: torch.relu(_SMALL_LINEAR(x)), lambda s, g: (_randn(g, s[0], 97),), ((131,), (67,)), False, freeze=True
    ),
}


# Families whose compile alone takes most of `make test`'s budget (the symbolic schedule of a conv's
# backward: ~40 s of proofs on 2 cores): `make fuzz` only.
SOAK_FAMILIES = {
    "conv_backward_dynamic": Family(
        _conv(4, 6, 3, stride=2, padding=1), _planes(4), ((2, 9, 11), (5, 13, 17), (3, 21, 19)), True, grad=True
    ),
}


def _compare(got: object, want: object, tol: float, where: str) -> None:
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{where}: {m}")


def _call(fn: Callable[..., object], args: Sequence[torch.Tensor], grad: bool) -> tuple[object, ...]:
    if not grad:
        with torch.no_grad():
            return (fn(*args),)
    leaves = [a.detach().requires_grad_(True) for a in args]
    params = [p for p in getattr(fn, "parameters", list)() if p.requires_grad]
    for p in params:
        p.grad = None
    out = fn(*leaves)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return (out.detach(), *(a.grad for a in leaves), *(p.grad.clone() for p in params))


def check_family(name: str, fam: Family, reps: int = REPS) -> None:
    """Compile once (the first size), then at every size and thread count call `reps` times on
    fresh inputs, each result against eager's."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True, freeze=fam.freeze)
    compiled = torch.compile(fam.fn, backend=backend, dynamic=fam.dynamic)
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(len(name))
    try:
        for size in fam.sizes:
            for nt in THREADS:
                torch.set_num_threads(nt)
                for rep in range(reps):
                    args = fam.inputs(size, g)
                    got = _call(compiled, args, fam.grad)
                    want = _call(fam.fn, args, fam.grad)
                    _compare(got, want, fam.tol, f"{name} at {size}, {nt} threads, call {rep}")
    finally:
        torch.set_num_threads(before)
    assert backend.stats["graphs"] >= 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_is_eager_on_every_call(name: str) -> None:
    check_family(name, FAMILIES[name])


@pytest.mark.skipif(not SOAK, reason="make fuzz only (VFUSE_FUZZ=soak): compiles for ~40 s")
@pytest.mark.parametrize("name", sorted(SOAK_FAMILIES))
def test_soak_family_is_eager_on_every_call(name: str) -> None:
    check_family(name, SOAK_FAMILIES[name])


@st.composite
def bmm_families(draw: st.DrawFn) -> Family:
    """Batched GEMMs over an odd batch: M 1..13 (one MC block) or past one, K and N primes (N
    past a column panel sometimes), static or dynamic over the batch and N."""
    m = draw(st.sampled_from((1, 3, 6, 7, 13, 97)))
    k = draw(st.sampled_from((1, 5, 37, 401, 1283)))
    ns = draw(st.lists(st.sampled_from((1, 17, 61, 211, 1999)), min_size=1, max_size=3))
    batches = draw(st.lists(st.sampled_from((1, 3, 5, 7)), min_size=len(ns), max_size=len(ns)))
    dynamic = draw(st.booleans()) and len(ns) > 1
    sizes = tuple(zip(batches, ns, strict=True)) if dynamic else ((batches[0], ns[0]),)
    return Family(torch.bmm, _bmm(m, k), sizes, dynamic, tol=2e-4 if k > 1000 else 1e-4)


@st.composite
def conv_families(draw: st.DrawFn) -> Family:
    """Convs over odd batches and prime planes: grouped, strided, padded, 1x1; static or dynamic."""
    groups = draw(st.sampled_from((1, 1, 2, 3)))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 4))
    kernel = draw(st.sampled_from((1, 3, (3, 2), 5)))
    stride, padding = draw(st.sampled_from((1, 2))), draw(st.sampled_from((0, 1)))
    planes = st.tuples(st.sampled_from((1, 3, 5, 7)), st.sampled_from((7, 13, 23)), st.sampled_from((9, 17, 29)))
    sizes = tuple(draw(st.lists(planes, min_size=1, max_size=3)))
    dynamic = draw(st.booleans()) and len(sizes) > 1
    conv = _conv(cin, cout, kernel, stride=stride, padding=padding, groups=groups)
    return Family(conv, _planes(cin), sizes if dynamic else sizes[:1], dynamic)


@fuzz_settings(DRAWN_EXAMPLES)
@given(fam=bmm_families())
def test_drawn_bmm_is_eager_on_every_call(fam: Family) -> None:
    check_family("bmm", fam)


@fuzz_settings(DRAWN_EXAMPLES)
@given(fam=conv_families())
def test_drawn_conv_is_eager_on_every_call(fam: Family) -> None:
    check_family("conv", fam)
