"""Row and column kernels in Triton's interpreter against eager: persistent rows (1, a prime)
and looped ones (past the 8192-element persistent limit), whose mean/variance (Welford) and
max/sum (online softmax) come from one walk of the row: two reads of the row, not three."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import as_list, compile_triton

from vfuse.schedule.kernel import GpuWalk
from vfuse.schedule.rowmerge import RowMethod

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _ln_gelu(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    w = torch.linspace(0.5, 1.5, n, dtype=x.dtype)
    return F.gelu(F.layer_norm(x, (n,), w, torch.linspace(-1, 1, n, dtype=x.dtype)))


def _rms_silu(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return F.silu(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _ln_scale_bias(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],)) * 0.5 + 0.25


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.7, -1)


PATTERNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "layernorm_gelu": _ln_gelu,
    "rmsnorm_silu": _rms_silu,
    "layernorm_scale_bias": _ln_scale_bias,
    "softmax": _softmax,
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "var_mean": lambda x: torch.var_mean(x, -1),
}
# the pair of passes each pattern merges when its row is looped
METHOD = {"layernorm_gelu": RowMethod.WELFORD, "layernorm_scale_bias": RowMethod.WELFORD,
          "softmax": RowMethod.ONLINE_SOFTMAX, "log_softmax": RowMethod.ONLINE_SOFTMAX,
          "var_mean": RowMethod.WELFORD}  # fmt: skip


def _check(fn: Callable, x: torch.Tensor, tol: float) -> object:
    compiled = compile_triton(fn, (x,))
    got, want = as_list(compiled(x)), as_list(fn(x))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)
    return compiled


def _gpu(compiled: object) -> object:
    kernels = compiled.compiled.executor.program.kernels  # type: ignore[attr-defined]
    assert len(kernels) == 1
    return kernels[0].gpu


@pytest.mark.filterwarnings("ignore:var_mean")  # a row of 1: eager's NaN variance, matched
@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n", [1, 13, 8209])  # persistent (one chunk) and looped
def test_rows_match_eager_fp32(name: str, n: int) -> None:
    x = torch.randn(2, n) * 3 + 1
    compiled = _check(PATTERNS[name], x, TOL[torch.float32])
    g = _gpu(compiled)
    assert g.persistent == (n <= 8192)
    source = compiled.compiled.executor.source  # type: ignore[attr-defined]
    if n > 8192 and name in METHOD:
        assert [m.method for m in g.merges] == [METHOD[name]]
        passes = len(compiled.compiled.executor.program.kernels[0].passes)  # type: ignore[attr-defined]
        assert source.count("for c0_ in range") == passes - 1  # statistics in one walk
    elif n > 8192:
        assert not g.merges


@pytest.mark.parametrize("name", ["layernorm_gelu", "softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_looped_rows_low_precision(name: str, dtype: torch.dtype) -> None:
    x = (torch.randn(2, 8209) * 2).to(dtype)
    _check(PATTERNS[name], x, TOL[dtype])


def test_wide_row() -> None:
    """A 40000-wide row: 20 chunks of 2048, one walk for mean and variance, a large mean offset
    (var / mean^2 = 1e-6: the one-pass sum-of-squares formula would lose the variance to
    cancellation, by ~10%). Against fp64 (measured 3e-5 off, eager 2e-5). (65536-wide
    rows do not reach one kernel: the planner's smem-budget rule splits them.)"""
    torch.manual_seed(0)
    x = torch.randn(1, 40000) * 0.1 + 100.0
    compiled = compile_triton(_ln_scale_bias, (x,))
    kernels = compiled.compiled.executor.program.kernels  # type: ignore[attr-defined]
    assert [m.method for k in kernels for m in k.gpu.merges] == [RowMethod.WELFORD]
    want = _ln_scale_bias(x.double()).float()
    torch.testing.assert_close(compiled(x), want, rtol=0, atol=2e-4)
    _check(_softmax, torch.randn(1, 40000) * 20, 2e-5)


def test_online_softmax_special_values() -> None:
    """NaN, +inf and all -inf rows give eager's NaN rows; -inf elements give 0; huge values
    late in the row rescale the earlier chunks' sums."""
    x = torch.randn(6, 8209)
    x[0, 5000] = float("nan")
    x[1, 9] = float("inf")
    x[2, :] = float("-inf")
    x[3, ::3] = float("-inf")
    x[4, 8200:] = 80.0
    x[5, :100] = -1e30
    _check(lambda t: torch.softmax(t, -1), x, 2e-5)


@pytest.mark.parametrize("name", ["layernorm_gelu", "softmax"])
def test_merged_walk_compiles_for_sm90_without_spills(name: str) -> None:
    """Welford's and online softmax's extra per-lane state (3 and 1 [1, 2048] tiles over 8 warps)
    fit the registers: offline for sm_90, no spill (measured 64 registers per thread)."""
    x = torch.randn(2, 8209)
    compiled = compile_triton(PATTERNS[name], (x,))
    assert _gpu(compiled).merges
    (kernel,) = compiled.compiled.executor.kernels  # type: ignore[attr-defined]
    figures = kernel.resources(90)
    print(name, figures)
    assert figures["spill_bytes"] == 0 and figures["registers"] <= 128


@pytest.mark.filterwarnings("ignore:var")  # a column of 1: eager's NaN variance, matched
@pytest.mark.parametrize("shape", [(1, 5), (7, 1), (2000, 37), (9001, 3), (1000, 67)])
def test_column_reductions(shape: tuple[int, int]) -> None:
    x = torch.randn(*shape) + 2
    compiled = _check(lambda t: (t.sum(0), t.amax(0), t.var(0), torch.softmax(t, 0)), x, 1e-4)
    if shape == (1000, 67):  # a COLUMNS tile walked down 1000 rows in chunks
        kernels = compiled.compiled.executor.program.kernels  # type: ignore[attr-defined]
        assert any(k.gpu.walk is GpuWalk.COLUMNS and not k.gpu.persistent for k in kernels)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: ((t.exp() - t.mean(-1, keepdim=True)) ** 2).sum(-1),  # squares of another value
        lambda t: torch.exp(t - t.amax(-1, keepdim=True) * 0.5).sum(-1),  # exp of x minus half the max
    ],
    ids=["other_value", "other_shift"],
)
def test_near_misses_keep_their_passes(fn: Callable) -> None:
    """Passes that look like the merged shapes but reduce another value keep one walk each."""
    x = torch.randn(2, 8209)
    compiled = _check(fn, x, 1e-4)
    assert not _gpu(compiled).merges
