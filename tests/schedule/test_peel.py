"""Window kernels' SIMD loops peeled at the borders (schedule/peel.py): the interior found exactly,
and pools / padded windows of odd sizes still compute eager's numbers with the peel rendered."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.ir import DType
from vfuse.schedule.expr import Clamp, Lin, Var, unclamp
from vfuse.schedule.kernel import Kernel, Load, Loop, Pass, Store
from vfuse.schedule.peel import interior

V, W = Var(3), Var(2)


def _pass(*indices: Lin) -> Pass:
    loads = tuple(Load(f"t{i}", DType.F32, "x", e) for i, e in enumerate(indices))
    return Pass((), (*loads, Store("y", Lin.var(V), "t0", DType.F32)), ())


def _clamp(e: Lin, lo: int, hi: int) -> Lin:
    return Lin(0, ((Clamp(e, lo, hi), 1),))


def test_interior_is_where_no_clamp_is_active() -> None:
    # taps 2v-1 and 2v+1 of a 32-wide row, 16 outputs: v = 0 reads -1, v = 16 would read 33
    taps = [_clamp(Lin.var(V) * 2 - 1, 0, 31), _clamp(Lin.var(V) * 2 + 1, 0, 31)]
    assert interior(_pass(*taps), Loop(3, 16)) == (1, 16)
    # a tap 3v+4 of a 20-wide row: active from v = 6 (22 > 19)
    assert interior(_pass(_clamp(Lin.var(V) * 3 + 4, 0, 19)), Loop(3, 10)) == (0, 6)
    # reversed: 9 - v in [0, 5] for v in [4, 9]
    assert interior(_pass(_clamp(Lin.var(V) * -1 + 9, 0, 5)), Loop(3, 12)) == (4, 10)


def test_no_peel_when_a_clamp_mixes_loops_or_none_is_on_the_simd_loop() -> None:
    assert interior(_pass(_clamp(Lin.var(V) + Lin.var(W), 0, 31)), Loop(3, 16)) is None
    assert interior(_pass(_clamp(Lin.var(W) * 2 - 1, 0, 31) + Lin.var(V)), Loop(3, 16)) is None
    assert interior(_pass(_clamp(Lin.var(V) - 40, 0, 3)), Loop(3, 16)) is None  # always active


def test_unclamp_drops_only_the_loops_own_clamps() -> None:
    outer = _clamp(Lin.var(W) * 2 - 1, 0, 31) * 32
    e = outer + _clamp(Lin.var(V) * 2 - 1, 0, 31) + 1024
    assert unclamp(e, V.id) == outer + Lin.var(V) * 2 - 1 + 1024


CASES = {
    "max 3x3 s2 p1, BN-like affine, ReLU": (lambda x: F.max_pool2d(torch.relu(x * 1.5 - 0.2), 3, 2, 1), (2, 3, 33, 31)),
    "avg 3x3 s1 p1": (lambda x: F.avg_pool2d(x, 3, 1, 1), (1, 5, 17, 13)),
    "max 5x3 s3 p(2,1) ceil": (lambda x: F.max_pool2d(x, (5, 3), 3, (2, 1), ceil_mode=True), (2, 2, 23, 29)),
    "avg 3x3 s2 p1 no pad count": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), (1, 4, 9, 11)),
    "max 3 s2 p1, 1-wide": (lambda x: F.max_pool2d(x, 3, 2, 1), (1, 2, 7, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pools_match_eager_with_the_peel(name: str) -> None:
    fn, shape = CASES[name]
    x = torch.randn(shape)
    g = vfuse.compile(fn, (x,))
    torch.testing.assert_close(g(x), fn(x), rtol=1e-6, atol=1e-6)
    kernels = [k for k in g.compiled.executor.program.kernels if isinstance(k, Kernel)]
    peeled = [p.peel for k in kernels for p in k.passes if p.peel]
    if shape[-1] > 1 and "1-wide" not in name:
        assert peeled, "the window kernel's SIMD loop was not peeled"
