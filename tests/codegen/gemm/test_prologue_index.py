"""GEMM operand packers with 32-bit indices (codegen/cpp/gemm/prologue.py `fits_int32`): a strided
conv's weight gradient reads x[n, c, 2h, 2w] and grad_output through K = (n, h, w), split by / and
%; with `long` indices g++ cannot vectorize the divisions on AVX2 (no 64-bit multiply-high), so
where every index stays below 2^31 the packers' r and c are `int`. Checked: the bound (sizes,
coefficients, div / mod / clamp, symbolic sizes and run-time indices refused), the rendered
packers, and numerics vs eager at odd sizes, at the machine's tier, the generic tier and ARM64."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy
import torch
import torch.nn.functional as F
from tests.aarch64.cross import missing_tools, run_arm64
from torch.utils._sympy.value_ranges import ValueRanges

import vfuse
from vfuse.codegen.cpp.gemm.prologue import INT32_LIMIT, Prologue, fits_int32, render_packer
from vfuse.compiler import optimize, plan, render, schedule
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.frontend.lower import lower
from vfuse.ir import DType
from vfuse.ir.sym import SymEnv
from vfuse.schedule.expr import Clamp, Div, Dyn, Lin, Mod, Var
from vfuse.schedule.kernel import Load
from vfuse.targets import get_target
from vfuse.targets.cpu import at_tier
from vfuse.targets.isa import ARM, CpuIsa, Isa


def _load(index: Lin) -> Load:
    return Load("v", DType.F32, "x", index)


def _lin(const: int, *terms: tuple[object, int]) -> Lin:
    return Lin(const, tuple(terms))  # type: ignore[arg-type]


# x[n, c, 2h, 2w] of an (8, 32, 28, 28) input as the (1568, 32) B of a 1x1 s2 weight gradient.
R, C = Var(0), Var(1)
ROW = Mod(_lin(0, (Div(Lin.var(R), 14), 1)), 14)
STRIDED = _lin(0, (Div(Lin.var(R), 196), 25088), (ROW, 56), (Mod(Lin.var(R), 14), 2), (C, 784))


def test_bound_of_a_strided_conv_operand_fits() -> None:
    assert fits_int32([_load(STRIDED)], (1568, 32))


def test_bound_counts_every_term_and_the_constant() -> None:
    # The largest offset is 25088 * (K // 196) + ... ; a K that makes the first term alone pass 2^31 is refused.
    k = (INT32_LIMIT // 25088 + 2) * 196
    assert not fits_int32([_load(STRIDED)], (k, 32))
    # A negative coefficient counts by its magnitude: partial sums may be added in any order.
    assert not fits_int32([_load(_lin(0, (R, -(1 << 30)), (C, 1 << 30)))], (3, 2))
    assert not fits_int32([_load(_lin(INT32_LIMIT, (R, 1)))], (2, 2))
    assert fits_int32([_load(_lin(-5, (Clamp(_lin(-1, (R, 1)), 0, 6), 3)))], (7, 1))


def test_bound_refuses_what_it_cannot_bound() -> None:
    assert not fits_int32([_load(_lin(0, (Dyn("row"), 4), (C, 1)))], (3, 3))  # a run-time index
    assert not fits_int32([_load(_lin(0, (Var(5), 1)))], (3, 3))  # a variable outside the operand
    rows = SymEnv({sympy.Symbol("s0"): (8, ValueRanges(2, 64))}).size(sympy.Symbol("s0"))
    assert not fits_int32([_load(_lin(0, (R, 1)))], (rows, 3))  # a symbolic size
    assert not fits_int32([], (1 << 31, 1))  # an extent past int32 itself


def test_int_indices_rendered_only_when_they_fit() -> None:
    body, value = (), "vg_e0[25088 * ((r) / 196) + 784 * c]"
    wide = render_packer("k", "b", 16, Prologue(body, value, "c", False), ", const float* vg_e0")
    narrow = render_packer("k", "b", 16, Prologue(body, value, "c", True), ", const float* vg_e0")
    assert "const long r = static_cast<long>(k0 + kk)" in wide and "const int" not in wide
    assert "const int r = static_cast<int>(k0 + kk)" in narrow and "const int c = static_cast<int>(s0 + s)" in narrow


def _wgrad(dy: torch.Tensor, x: torch.Tensor, s: tuple[int, int]) -> torch.Tensor:
    """A 1x1 strided conv's weight gradient as the lowering writes it: (Cout, K) @ (K, Cin)."""
    xs = x[:, :, :: s[0], :: s[1]]
    a = dy.permute(1, 0, 2, 3).reshape(dy.shape[1], -1)
    return a @ xs.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


# (N, Cin, H, W), Cout, stride, tier: prime channels, widths 7 and 17, stride (1, 2), one channel
SHAPES = [
    ((3, 5, 17, 7), 7, (2, 2), "auto"),
    ((2, 13, 9, 17), 3, (1, 2), "auto"),
    ((1, 1, 7, 7), 1, (2, 2), "auto"),
    ((3, 5, 17, 7), 7, (2, 2), "generic"),
]


def _source(fn: object) -> str:
    return fn.compiled.executor.source  # type: ignore[attr-defined]


@pytest.mark.parametrize(("shape", "cout", "stride", "isa"), SHAPES)
def test_strided_weight_gradient_matmul_matches_eager(
    shape: tuple[int, ...], cout: int, stride: tuple[int, int], isa: str, tmp_path: Path
) -> None:
    torch.manual_seed(sum(shape) + cout)
    x = torch.randn(*shape)
    ho, wo = -(-shape[2] // stride[0]), -(-shape[3] // stride[1])
    dy = torch.randn(shape[0], cout, ho, wo)
    fn = vfuse.compile(lambda a, b: _wgrad(a, b, stride), (dy, x), isa=isa, cache_dir=tmp_path / "c")
    want = _wgrad(dy, x, stride)
    got = fn(dy, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    packers = re.findall(r"_pack_[ab]\(long b.*?\n}\n", _source(fn), re.S)
    assert packers and all("const int" in p for p in packers), "both operands computed while packing, int indices"


@pytest.mark.parametrize(("k", "stride", "pad"), [(1, (2, 2), (0, 0)), (3, (2, 2), (1, 1)), (3, (1, 2), (2, 0))])
def test_strided_conv_gradients_match_eager(k: int, stride: tuple[int, int], pad: tuple[int, int]) -> None:
    torch.manual_seed(k + sum(stride) + sum(pad))
    conv = torch.nn.Conv2d(5, 7, k, stride=stride, padding=pad)
    shape = (3, 5, 17, 7)
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend=vfuse.backend(strict=True))
    x = torch.randn(*shape)
    xe, xv = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = F.conv2d(xe, conv.weight, conv.bias, stride, pad)
    got = compiled(xv)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    go = torch.randn_like(want)
    (wx, ww, wb) = torch.autograd.grad(want, (xe, conv.weight, conv.bias), go)
    (gx, gw, gb) = torch.autograd.grad(got, (xv, conv.weight, conv.bias), go)
    for g, w in ((gx, wx), (gw, ww), (gb, wb)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())


@pytest.mark.aarch64
@pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))
def test_strided_weight_gradient_matmul_on_arm64(tmp_path: Path) -> None:
    """The int-indexed packers cross-compiled for ARM64 (4 fp32 lanes) and run under qemu."""
    torch.manual_seed(3)
    x, dy = torch.randn(2, 5, 9, 7), torch.randn(2, 3, 5, 4)
    inputs = (dy, x)
    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(lambda a, b: _wgrad(a, b, (2, 2)), inputs).graph_module, ctx), ctx)
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset(), ARM))
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    source = render(program, ctx)
    assert re.search(r"_pack_[ab]\(long b.*?const int", source, re.S)
    got = run_arm64(program, graph, source, inputs, [], tmp_path)
    want = _wgrad(dy, x, (2, 2))
    torch.testing.assert_close(got[graph.outputs[0]], want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
