"""GEMM epilogues that also write column sums (`Epilogue.colsum`: a bias gradient from the tile)
against torch, and bit-identical for every thread count (partials per MR-row sliver, fixed order)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import Blocking, Epilogue, EpilogueArg, GemmSpec, render_gemm

# dH = (dY @ W) * gelu'(h): the GELU backward as the epilogue; its column sums go to `db`.
_GELU_GRAD = (
    "const float vx = h[o];",
    "const float cdf = 0.5f * (1.0f + vg_erf(vx * 0.70710678118654752f));",
    "const float pdf = 0.3989422804014327f * vg_exp(-0.5f * vx * vx);",
    "v = v * (cdf + vx * pdf);",
)
_ARGS = (EpilogueArg("h", "const float*"), EpilogueArg("db", "float*"))
SPECS = {
    "cs_odd": GemmSpec("cs_odd", 131, 67, 29),  # primes: a short last sliver, a column tail
    "cs_one_row": GemmSpec("cs_one_row", 1, 45, 13, trans_b=True),
    "cs_deep": GemmSpec("cs_deep", 37, 53, 70, blocking=Blocking(8, 32, 24, 16, 64)),  # K blocks through C
    "cs_batched": GemmSpec.from_shapes("cs_batched", (3, 19, 11), (11, 23)),  # summed over batch entries too
}


def _epilogue() -> Epilogue:
    return Epilogue("gelu_grad_colsum", _ARGS, _GELU_GRAD, colsum="v", colsum_out="db")


@pytest.fixture(scope="module")
def lib(build):
    return build("\n".join(render_gemm(s, _epilogue()) for s in SPECS.values()))


def _run(lib, call, spec: GemmSpec, nthreads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(spec.m * 1000 + spec.n)
    batch = spec.batch or ()
    a = torch.randn(*batch, spec.m, spec.k)
    b = torch.randn(spec.n, spec.k) if spec.trans_b else torch.randn(spec.k, spec.n)
    h = torch.randn(*batch, spec.m, spec.n)
    out, db = torch.full_like(h, float("nan")), torch.full((spec.n,), float("nan"))
    call(lib, spec.name, a, b, out, h, db, nthreads=nthreads)
    x = h.clone().requires_grad_()
    F.gelu(x).backward(torch.matmul(a, b.T if spec.trans_b else b))
    return out, db, x.grad


@pytest.mark.parametrize("name", list(SPECS))
def test_colsum_matches_torch(lib, call, name: str) -> None:
    spec = SPECS[name]
    out, db, want = _run(lib, call, spec, 2)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, want.reshape(-1, spec.n).sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["cs_odd", "cs_batched"])  # 3 threads: cs_batched's entries run one per thread
def test_colsum_same_bits_for_any_threads(lib, call, name: str) -> None:
    sums = [_run(lib, call, SPECS[name], nt)[1] for nt in (1, 2, 3, 5)]
    assert all(torch.equal(s, sums[0]) for s in sums[1:])


def test_colsum_needs_fp32_output() -> None:
    epi = Epilogue("q", _ARGS, ("const int8_t vq = (int8_t)v;",), "vq", "int8_t", colsum="v", colsum_out="db")
    with pytest.raises(ValueError, match="column sums need an fp32 C"):
        render_gemm(GemmSpec("cs_int8", 4, 4, 4), epi)
