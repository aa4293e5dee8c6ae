"""Constant GEMM B operands packed once (`ContractionKernel.prepacked_b`, codegen/cpp/gemm/prepack.py).

Frozen Linear weights (read transposed, or dequantized from a constant int8 weight by the B
prologue) are packed into the arena's persistent region on the first call; later calls with
other inputs must still match eager, at every instruction-set tier this CPU runs, with several
KC / NC blocks (the prepacked layout's offsets) and batched A (3-D input). The kernel's
first-call init is raced from two threads straight through the C entry.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
import torch.nn.functional as F
from tests.kernel_families import tiers_here
from torch import nn

import vfuse
from vfuse.codegen.cpp.gemm import Blocking, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.prepack import HEADER, padded_n
from vfuse.schedule.kernel import ContractionKernel
from vfuse.schedule.printer import format_program
from vfuse.targets import get_target
from vfuse.targets.isa import IsaExtra

TIERS = [t.value for t in tiers_here()]
# The AVX-512 target's own extras: under VFUSE_ISA=avx2 the default target has none, but isa="avx512" gets them.
VNNI = "avx512" in TIERS and IsaExtra.VNNI in get_target("cpu", isa="avx512").isa_extras


class _DequantLinear(nn.Module):
    """Linear over an int8 weight buffer dequantized per channel: B is a prologue of constants."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.register_buffer("wq", torch.randint(-128, 128, (n, k), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(n) * 0.02 + 0.001)
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, self.wq.float() * self.ws[:, None], self.bias))


class _QLinear(nn.Module):
    """int8 activations times a frozen int8 weight (zero points on both, per-channel scales):
    the int32 dot product on VNNI targets (W and its column sums packed once), else the fp32
    template with a B prologue of constants."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.register_buffer("wq", torch.randint(-128, 128, (n, k), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(n) * 0.02 + 0.001)

    def forward(self, xq: torch.Tensor) -> torch.Tensor:
        w = (self.wq.float() - 3.0) * self.ws[:, None]
        return F.gelu(F.linear((xq.float() - 5.0) * 0.037, w))


@pytest.mark.parametrize("isa", TIERS)
def test_frozen_int8_weight_packed_once(isa: str) -> None:
    torch.manual_seed(12)
    model, shape = _QLinear(131, 45).eval(), (37, 131)
    with torch.no_grad():
        xq = torch.randint(-128, 128, shape, dtype=torch.int8)
        compiled = vfuse.compile(model, (xq,), backend="cpp", freeze=True, isa=isa)
        k = _kernel(compiled)
        assert k.prepacked_b and (k.int8 is not None) == (isa == "avx512" and VNNI)
        for _ in range(3):
            xq = torch.randint(-128, 128, shape, dtype=torch.int8)
            want = model(xq)
            torch.testing.assert_close(compiled(xq), want, rtol=1e-5, atol=1e-4 * float(want.abs().max()))


def _model(case: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(len(case))
    if case == "linear_gelu":
        return nn.Sequential(nn.Linear(70, 45), nn.GELU()).eval(), (13, 70)
    if case == "linear_3d":
        return nn.Sequential(nn.Linear(37, 61), nn.GELU()).eval(), (2, 5, 37)
    if case == "blocks":  # several KC blocks (avx2, avx512) or NC panels (generic, avx2)
        return nn.Sequential(nn.Linear(400, 700), nn.GELU()).eval(), (12, 400)
    return _DequantLinear(53, 29).eval(), (7, 53)


def _compile(model: nn.Module, shape: tuple[int, ...], isa: str, freeze: bool = True) -> object:
    with torch.no_grad():
        return vfuse.compile(model, (torch.randn(shape),), backend="cpp", freeze=freeze, isa=isa)


def _kernel(compiled: object) -> ContractionKernel:
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    (k,) = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    return k


@pytest.mark.parametrize("isa", TIERS)
@pytest.mark.parametrize("case", ["linear_gelu", "linear_3d", "blocks", "dequant"])
def test_frozen_weight_packed_once_matches_eager_every_call(case: str, isa: str) -> None:
    model, shape = _model(case)
    compiled = _compile(model, shape, isa)
    assert _kernel(compiled).prepacked_b
    for call in range(3):  # the first call packs, the others reuse the packed weight
        x = torch.randn(shape) * (call + 1)
        with torch.no_grad():
            want = model(x)
            got = compiled(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_schedule_marks_only_constant_b() -> None:
    model, shape = _model("linear_gelu")
    frozen, live = _compile(model, shape, "auto"), _compile(model, shape, "auto", freeze=False)
    assert _kernel(frozen).prepacked_b and not _kernel(live).prepacked_b
    assert "B packed once" in format_program(frozen.compiled.executor.program)  # type: ignore[attr-defined]
    # x @ y with both operands inputs: nothing constant to pack.
    xy = vfuse.compile(lambda x, y: x @ y, (torch.randn(5, 7), torch.randn(7, 9)), backend="cpp")
    assert not _kernel(xy).prepacked_b
    conv = nn.Conv2d(3, 8, 3).eval()  # a conv's frozen weight (operand 1) is packed once too
    assert _kernel(_compile(conv, (1, 3, 9, 9), "auto")).prepacked_b
    assert not _kernel(_compile(conv, (1, 3, 9, 9), "auto", freeze=False)).prepacked_b


def test_same_architecture_other_weights_keep_their_own_packing() -> None:
    """Two models of one shape share the cached library; each packs its own weight in its own arena."""
    (m1, shape), (m2, _) = _model("linear_gelu"), _model("linear_gelu")
    with torch.no_grad():
        m2[0].weight.mul_(-2.0)
    c1, c2 = _compile(m1, shape, "auto"), _compile(m2, shape, "auto")
    x = torch.randn(shape)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(c1(x), m1(x), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(c2(x), m2(x), rtol=1e-4, atol=1e-5)


def test_first_call_race_packs_once(build) -> None:
    """Two threads enter a prepacking kernel for the first time together (ctypes drops the GIL):
    both results right, the region marked packed; B changed afterwards is not seen (packed once)."""
    spec = GemmSpec(
        "pp_race", 50, 77, 90, trans_b=True, linkage='extern "C"', blocking=Blocking(8, 32, 24, 32, 64), prepack=True
    )
    lib = build(render_gemm(spec, E.none()))
    b = torch.randn(77, 90)
    region = torch.zeros(HEADER + 4 * 90 * padded_n(77, 32), dtype=torch.uint8)
    a = [torch.randn(50, 90) for _ in range(2)]
    c = [torch.empty(50, 77) for _ in range(2)]
    fn = lib.pp_race
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]

    def run(i: int) -> None:
        fn(a[i].data_ptr(), b.data_ptr(), c[i].data_ptr(), region.data_ptr(), 2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        torch.testing.assert_close(c[i], a[i] @ b.T, rtol=1e-4, atol=1e-4)
    assert region[:4].view(torch.int32).item() == 2
    want = a[0] @ b.T
    b.zero_()
    run(0)
    torch.testing.assert_close(c[0], want, rtol=1e-4, atol=1e-4)


def test_first_calls_from_two_threads() -> None:
    """Two Python threads make a compiled frozen model's first calls together: both right."""
    model, shape = _model("linear_3d")
    compiled = _compile(model, shape, "auto")
    xs = [torch.randn(shape) for _ in range(2)]
    got: list[torch.Tensor | None] = [None, None]

    def run(i: int) -> None:
        with torch.no_grad():
            got[i] = compiled(xs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        for i in range(2):
            torch.testing.assert_close(got[i], model(xs[i]), rtol=1e-4, atol=1e-5)
