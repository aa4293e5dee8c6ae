"""Window kernels' SIMD loops peeled at the borders (schedule/peel.py): the interior found exactly,
and pools / padded windows of odd sizes still compute eager's numbers with the peel rendered."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.ir import DType
from vfuse.schedule.expr import Clamp, Lin, Var, unclamp
from vfuse.schedule.kernel import Kernel, Load, Loop, Pass, Store
from vfuse.schedule.peel import interior, threaded_selects
from vfuse.targets.isa import Isa

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


VALUES_ONLY = {
    "max 3x3 s2 p1": (lambda x: F.max_pool2d(x, 3, 2, 1), (2, 3, 31, 29)),
    "max 3x3 s1 p1": (lambda x: F.max_pool2d(x, 3, 1, 1), (1, 2, 13, 37)),
    "max 2x2 s2 ceil": (lambda x: F.max_pool2d(x, 2, 2, 0, ceil_mode=True), (1, 3, 7, 11)),
    "max 3x3 s2 p0 ceil": (lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True), (2, 2, 16, 23)),
    "max 3x3 s2 p1 dilation 2": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2), (1, 2, 19, 17)),
    "max 3x3 s1 p1 1x1 plane": (lambda x: F.max_pool2d(x, 3, 1, 1), (1, 3, 1, 1)),
    "max 3x3 s2 p1 one row": (lambda x: F.max_pool2d(x, 3, 2, 1), (1, 2, 1, 41)),
    "avg 3x3 s2 p1": (lambda x: F.avg_pool2d(x, 3, 2, 1), (2, 3, 31, 29)),
}


@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("name", list(VALUES_ONLY))
def test_values_only_pools_match_eager(name: str, isa: str) -> None:
    """Pools with no producer fused in (their taps feed the border selects only), NaN and ties included."""
    fn, shape = VALUES_ONLY[name]
    x = torch.randn(shape)
    x.view(-1)[::7] = 0.5  # ties
    x.view(-1)[x.numel() // 2] = float("nan")
    try:
        g = vfuse.compile(fn, (x,), isa=isa)
    except vfuse.VfuseOptionError:
        pytest.skip(f"this CPU has no {isa} tier")
    torch.testing.assert_close(g(x), fn(x), rtol=1e-6, atol=1e-6, equal_nan=True)
    kernels = [k for k in g.compiled.executor.program.kernels if isinstance(k, Kernel)]
    # clamped rows (a window's top and bottom) are what g++'s jump threading split on
    assert any(k.no_jump_threading for k in kernels) or min(shape[-2:]) == 1


def test_values_only_max_pool_interior_vectorizes(tmp_path) -> None:
    """The peeled interior of a 3x3 stride-2 max-pool (taps feeding only the border selects) is a
    vectorized loop: with jump threading on, g++ 12 left its loads conditional and ran it scalar."""
    x = torch.randn(1, 4, 29, 31)
    g = vfuse.compile(lambda x: F.max_pool2d(x, 3, 2, 1), (x,))
    source = g.compiled.executor.source
    k = next(k for k in g.compiled.executor.program.kernels if isinstance(k, Kernel))
    assert k.no_jump_threading and threaded_selects(k)
    if g.compiled.executor.program.isa is Isa.GENERIC:
        pytest.skip("the generic tier is scalar by design (VFUSE_ISA=generic): g++ leaves stride-2 taps unvectorized")
    cpp = tmp_path / "k.cpp"
    cpp.write_text(source)
    tc = find_toolchain()
    if "clang" in tc.version.lower():
        pytest.skip("-fopt-info is g++'s report")
    flags = [f for f in tc.flags if f != "-shared"]
    out = subprocess.run([tc.cxx, *flags, "-c", str(cpp), "-o", str(tmp_path / "k.o"), "-fopt-info-vec-optimized"],
                         capture_output=True, text=True, check=True).stderr  # fmt: skip
    interior_line = next(
        i for i, line in enumerate(source.splitlines(), 1) if re.search(r"for \(int64_t i\d+ = 1;", line)
    )
    reported = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", out)}
    assert reported & {interior_line, interior_line + 1}, out[-2000:]  # g++ names the loop or its first line


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_strided_windows_take_256_bit_vectors_on_16_lane_targets(isa: str) -> None:
    """Stride-2 taps (two loads and a permute per vector) in 8-lane vectors where the target has 16
    (`Kernel.narrow_simd`); stride-1 windows keep the target's width."""
    x = torch.randn(2, 3, 32, 31)
    flags = {}
    for stride in (1, 2):
        try:
            g = vfuse.compile(lambda x, s=stride: F.max_pool2d(torch.relu(x * 1.5 - 0.2), 3, s, 1), (x,), isa=isa)
        except vfuse.VfuseOptionError:
            pytest.skip(f"this CPU has no {isa} tier")
        program = g.compiled.executor.program
        kernels = [k for k in program.kernels if isinstance(k, Kernel)]
        flags[stride] = (program.vector_width, [k.narrow_simd for k in kernels])
        torch.testing.assert_close(g(x), F.max_pool2d(torch.relu(x * 1.5 - 0.2), 3, stride, 1), rtol=0, atol=0)
    lanes = flags[2][0]
    assert flags[2][1] == [lanes > 8] and flags[1][1] == [False]
