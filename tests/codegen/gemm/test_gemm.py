"""Generated GEMM + epilogue kernels against torch (fp32, rtol 1e-4)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import Blocking, Epilogue, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.schedule.microtile import VectorUnit

Ref = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Case:
    spec: GemmSpec
    epi: Epilogue
    extras: tuple[str, ...] = ()  # epilogue arg kinds: "bias" (N), "res" (like C)
    ref: Ref = lambda y: y  # applied to A @ B (+ bias) in torch
    nthreads: int = 2


def _gelu_tanh(y: torch.Tensor) -> torch.Tensor:
    return F.gelu(y, approximate="tanh")


CASES = {
    "odd_plain": Case(GemmSpec("odd_plain", 37, 53, 29), E.none()),
    "k1_bias": Case(GemmSpec("k1_bias", 5, 17, 1), E.bias(), ("bias",)),
    "trans_gelu_erf": Case(GemmSpec("trans_gelu_erf", 67, 45, 130, trans_b=True), E.bias_gelu_erf(), ("bias",), F.gelu),
    "gelu_tanh": Case(GemmSpec("gelu_tanh", 33, 70, 64, trans_b=True), E.bias_gelu_tanh(), ("bias",), _gelu_tanh),
    "relu": Case(GemmSpec("relu", 29, 96, 40), E.bias_relu(), ("bias",), F.relu),
    "silu": Case(GemmSpec("silu", 64, 33, 17, trans_b=True), E.bias_silu(), ("bias",), F.silu, nthreads=1),
    "residual": Case(GemmSpec("residual", 41, 50, 23), E.residual_add(), ("res",), nthreads=3),
    "scale": Case(GemmSpec("scale", 15, 31, 9), E.scale(0.125), (), lambda y: y * 0.125),
    # Tiny blocking: several MC, KC and NC blocks, so partial sums go through C before the epilogue.
    "multiblock_gelu": Case(
        GemmSpec("multiblock_gelu", 100, 100, 70, blocking=Blocking(14, 32, 30, 16, 64)),
        E.bias_gelu_erf(),
        ("bias",),
        F.gelu,
    ),
    # Default blocking, K > 1280 with many rows (DRAM regime): two K passes through C, then the epilogue.
    "deep_k": Case(GemmSpec("deep_k", 1200, 40, 1400, trans_b=True), E.bias_gelu_tanh(), ("bias",), _gelu_tanh),
    # One MC block (mc >= m), so each thread packs the B slivers of its own column chunk and no
    # K block has a barrier: several K and NC blocks, threads that get no chunk, a sliver tail.
    "own_slivers": Case(
        GemmSpec("own_slivers", 20, 150, 77, blocking=Blocking(14, 32, 28, 16, 64)),
        E.bias_gelu_erf(),
        ("bias",),
        F.gelu,
        nthreads=3,
    ),
    "own_slivers_t": Case(
        GemmSpec("own_slivers_t", 7, 203, 130, trans_b=True, blocking=Blocking(8, 48, 8, 32, 96)),
        E.residual_add(),
        ("res",),
        nthreads=4,
    ),
    # Row blocks of 2 or 3 eight-row slivers (17 slivers in 6 blocks, 2 per thread), the last partial.
    "balanced_rows": Case(
        GemmSpec("balanced_rows", 131, 70, 33, blocking=Blocking(8, 32, 24, 16, 64)),
        E.bias_relu(),
        ("bias",),
        F.relu,
        nthreads=3,
    ),
    "one_by_one": Case(GemmSpec("one_by_one", 1, 1, 1), E.bias_silu(), ("bias",), F.silu),
    "multiblock_8x48": Case(
        GemmSpec("multiblock_8x48", 61, 130, 45, trans_b=True, blocking=Blocking(8, 48, 24, 20, 96)),
        E.residual_add(),
        ("res",),
    ),
}


def _operands(spec: GemmSpec) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(spec.m, spec.k) / math.sqrt(spec.k)
    b = torch.randn(spec.n, spec.k) if spec.trans_b else torch.randn(spec.k, spec.n)
    return a, b


@pytest.fixture(scope="module")
def lib(build):
    """All cases in one translation unit: also checks kernels concatenate without clashes."""
    return build("\n".join(render_gemm(c.spec, c.epi) for c in CASES.values()))


@pytest.mark.parametrize("name", list(CASES))
def test_gemm_matches_torch(lib, call, name: str) -> None:
    case = CASES[name]
    spec = case.spec
    torch.manual_seed(zlib.crc32(name.encode()))
    a, b = _operands(spec)
    y = a @ (b.T if spec.trans_b else b)
    args: list[torch.Tensor] = []
    for kind in case.extras:
        extra = torch.randn(spec.n) if kind == "bias" else torch.randn(spec.m, spec.n)
        args.append(extra)
        y = y + extra
    out = torch.full((spec.m, spec.n), float("nan"))
    call(lib, spec.name, a, b, out, *args, nthreads=case.nthreads)
    torch.testing.assert_close(out, case.ref(y), rtol=1e-4, atol=1e-4)


BATCHED = GemmSpec.from_shapes("batched_bcast", (2, 3, 19, 21), (1, 3, 21, 37))
BATCHED_T = GemmSpec.from_shapes("batched_trans", (4, 9, 12), (9, 12), trans_b=True)


def test_from_shapes_strides() -> None:
    assert BATCHED.batch == (2, 3) and BATCHED.b_batch_strides == (0, 21 * 37)
    assert BATCHED.a_batch_strides == (3 * 19 * 21, 19 * 21) and BATCHED.c_batch_strides == (3 * 19 * 37, 19 * 37)
    assert (BATCHED_T.batch, BATCHED_T.b_batch_strides, BATCHED_T.n) == ((4,), (0,), 9)
    with pytest.raises(ValueError, match="broadcast"):
        GemmSpec.from_shapes("bad", (2, 3, 4), (3, 4, 5))


STRIDED = GemmSpec("strided", 20, 24, 16, lda=40, ldc=30, ldb=50, trans_b=True)


@pytest.fixture(scope="module")
def lib2(build):
    epi = E.residual_add("b * 703 + i * 37 + j")  # residual indexed through the batch index
    return build(render_gemm(BATCHED, epi) + render_gemm(STRIDED, E.bias()) + render_gemm(BATCHED_T, E.bias_relu()))


@pytest.mark.parametrize("nthreads", [1, 2, 4])
def test_batched_broadcast(lib2, call, nthreads: int) -> None:
    a = torch.randn(2, 3, 19, 21)
    b = torch.randn(1, 3, 21, 37)  # broadcast over the first batch dim (stride 0)
    res = torch.randn(2, 3, 19, 37)
    out = torch.empty(2, 3, 19, 37)
    call(lib2, "batched_bcast", a, b, out, res, nthreads=nthreads)
    torch.testing.assert_close(out, torch.matmul(a, b) + res, rtol=1e-4, atol=1e-4)


def test_leading_dimensions(lib2, call) -> None:
    a_full, w_full, out_full = torch.randn(20, 40), torch.randn(24, 50), torch.zeros(20, 30)
    bias = torch.randn(24)
    a, w = a_full[:, :16], w_full[:, :16]
    call(lib2, "strided", a_full, w_full, out_full, bias)
    torch.testing.assert_close(out_full[:, :24], F.linear(a, w, bias), rtol=1e-4, atol=1e-4)
    assert torch.count_nonzero(out_full[:, 24:]) == 0  # ldc padding untouched


@pytest.mark.parametrize(
    ("unit", "march"),
    [
        (VectorUnit(16, 32), "-mno-avx512f"),  # AVX-512's tile without AVX-512: g++ splits the vectors
        (VectorUnit(8, 16), "-march=x86-64-v3"),  # AVX2's tiles as an AVX2 machine builds them
        (VectorUnit(4, 16), "-march=x86-64"),  # the generic tier: SSE2
    ],
    ids=["avx512-tile-without-avx512", "avx2", "generic"],
)
def test_other_tiers(build, call, unit: VectorUnit, march: str) -> None:
    """The same source at another tier's width and register tile; same numbers."""
    spec = GemmSpec(f"tier_{unit.lanes}", 30, 40, 50, trans_b=True, unit=unit)
    lib = build(render_gemm(spec, E.bias_gelu_erf()), (march,))
    a, w, bias = torch.randn(30, 50) / 7, torch.randn(40, 50), torch.randn(40)
    out = torch.empty(30, 40)
    call(lib, spec.name, a, w, out, bias)
    torch.testing.assert_close(out, F.gelu(F.linear(a, w, bias)), rtol=1e-4, atol=1e-4)


def test_batched_weight_broadcast(lib2, call) -> None:
    """A 3-D input through nn.Linear: the weight (stride 0 over the batch) is shared."""
    x, w, bias = torch.randn(4, 9, 12), torch.randn(9, 12), torch.randn(9)
    out = torch.empty(4, 9, 9)
    call(lib2, "batched_trans", x, w, out, bias)
    torch.testing.assert_close(out, F.relu(F.linear(x, w, bias)), rtol=1e-4, atol=1e-4)


def test_shares_a_tu_with_the_pointwise_prelude(build, call) -> None:
    """The codegen TU starts with vfuse.codegen.cpp.prelude.PRELUDE; our kernels must not clash."""
    from vfuse.codegen.cpp import prelude

    spec = GemmSpec("with_prelude", 23, 40, 31, trans_b=True)
    epi = Epilogue("erf_std", E.bias().args, ("v += bias[j];", "v = 0.5f * v * (1.0f + std::erf(v * 0.70710678f));"))
    lib = build(prelude.PRELUDE + "\n" + render_gemm(spec, epi) + render_gemm(GemmSpec("again", 3, 4, 5), E.none()))
    a, w, bias = torch.randn(23, 31) / 5.6, torch.randn(40, 31), torch.randn(40)
    out = torch.empty(23, 40)
    call(lib, "with_prelude", a, w, out, bias)
    torch.testing.assert_close(out, F.gelu(F.linear(a, w, bias)), rtol=1e-4, atol=1e-4)


def test_own_slivers_repeated(lib, call) -> None:
    """Threads that pack their own B slivers share the panel buffer without barriers per K block:
    a layout overlap between a thread's last K block and another's next one shows up as a wrong
    element in some calls only (before sliver slots were fixed at NR x KC: ~1 call in 5)."""
    torch.manual_seed(7)
    for _ in range(40):
        for name in ("own_slivers", "own_slivers_t"):
            case = CASES[name]
            a, b = _operands(case.spec)
            extra = torch.randn(case.spec.n) if case.extras == ("bias",) else torch.randn(case.spec.m, case.spec.n)
            y = a @ (b.T if case.spec.trans_b else b) + extra
            out = torch.full((case.spec.m, case.spec.n), float("nan"))
            call(lib, case.spec.name, a, b, out, extra, nthreads=case.nthreads)
            torch.testing.assert_close(out, case.ref(y), rtol=1e-4, atol=1e-4)


# Five batch entries on two threads (not a multiple, under 4 per thread): the threads share one
# panel buffer across entries. One MC block (M 6), N 221 in panels of 64: the short last panel
# deals sliver 1 to thread 1, the next entry's first panel deals it to thread 0.
OWN_BATCHES = GemmSpec.from_shapes("own_batches", (5, 6, 36), (5, 36, 221), blocking=Blocking(6, 16, 6, 36, 64, 16))


def test_own_slivers_across_batch_entries(build, call) -> None:
    """Without a barrier at each later batch entry's first panel, thread 0 packed the next
    entry's sliver 1 while thread 1 still read it (a conv over 5 images of 13 x 17 under
    dynamic=True: one image's last columns wrong in ~1 call in 4)."""
    lib = build(render_gemm(OWN_BATCHES, E.bias_relu()))
    torch.manual_seed(5)
    for _ in range(40):
        a, b, bias = torch.randn(5, 6, 36), torch.randn(5, 36, 221), torch.randn(221)
        out = torch.full((5, 6, 221), float("nan"))
        call(lib, "own_batches", a, b, out, bias, nthreads=2)
        torch.testing.assert_close(out, torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
