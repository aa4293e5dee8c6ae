"""The prelude's fp32 GELU (erf form), erf, SiLU and sigmoid: accuracy, edge values, vectorization.

Accuracy is measured against float64 math over 2M points in [-20, 20]; edge values against
eager (and exactly where the prelude documents them). The vectorization check compiles one
`omp simd` loop per function to assembly with the project's flags: the integer clamps exist so
that gelu and erf loops carry no compare masks or blends.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import executor, inputs

from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa

INF, NAN = float("inf"), float("nan")
SPECIALS = [INF, -INF, NAN, 0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0, 1e30, -1e30]


def run_f32(x: torch.Tensor) -> list[torch.Tensor]:
    """gelu (erf form), erf, silu, sigmoid of x, natively."""
    b = GraphBuilder()
    (a,) = inputs(b, ((x.numel(),), DType.F32))
    outs = [b.add(Op.GELU, [a], approximate="none"), b.add(Op.ERF, [a]), b.add(Op.SILU, [a]), b.add(Op.SIGMOID, [a])]
    return executor(b.build(outs))([x])


def _near(value: float, n: int) -> torch.Tensor:
    bits = torch.tensor([value], dtype=torch.float32).view(torch.int32)
    return (bits + torch.arange(-n, n + 1, dtype=torch.int32)).view(torch.float32)


def test_accuracy_against_float64() -> None:
    x = torch.cat([torch.linspace(-20.0, 20.0, 2_000_000), _near(5.6, 1000), _near(-5.6, 1000), _near(4.0, 1000)])
    gelu, erf, silu, sigmoid = run_f32(x)
    xd = x.double()
    want_gelu = 0.5 * xd * (1 + torch.erf(xd / 2**0.5))
    torch.testing.assert_close(gelu.double(), want_gelu, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(gelu, F.gelu(x), rtol=1e-5, atol=2e-6)
    assert (erf.double() - torch.erf(xd)).abs().max() < 4.5e-7  # 4.4e-7 over every float
    e = torch.exp(-xd)
    # measured over every float: silu 2.40, sigmoid 2.48 ulp (1 ulp <= 1.19e-7 relative)
    torch.testing.assert_close(silu.double(), xd / (1 + e), rtol=3.6e-7, atol=0)
    torch.testing.assert_close(sigmoid.double(), 1 / (1 + e), rtol=3.6e-7, atol=0)


def test_special_values_against_eager() -> None:
    x = torch.tensor(SPECIALS)
    gelu, erf, silu, sigmoid = run_f32(x)
    torch.testing.assert_close(erf, torch.erf(x), rtol=4e-7, atol=0, equal_nan=True)  # 1 ulp at 1e-30
    torch.testing.assert_close(silu, F.silu(x), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(sigmoid, torch.sigmoid(x), rtol=0, atol=0, equal_nan=True)
    # gelu(+inf) = +inf (the limit; the old form gave it too) where eager gives NaN (inf * 0)
    assert gelu[0] == INF
    torch.testing.assert_close(gelu[1:], F.gelu(x[1:]), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(erf), torch.signbit(torch.erf(x)))  # erf keeps the sign of zero
    assert torch.signbit(silu[4]) and torch.signbit(silu[8]) and not torch.signbit(sigmoid[8])


def test_gelu_saturates_exactly() -> None:
    # The folded rational is exactly +-1 at |x| = 5.6: gelu(x) == 0 below -5.6, == x above 5.6.
    mags = torch.cat([torch.logspace(0.7482, 30, 20_000), _near(5.6, 0)[0:1], torch.tensor([3.4028234663852886e38])])
    mags = mags[mags >= 5.6]
    x = torch.cat([-mags, mags])
    gelu, erf, *_ = run_f32(x)
    assert torch.all(gelu[: mags.numel()] == 0)
    assert torch.equal(gelu[mags.numel() :], mags)
    assert torch.all(erf.abs() == 1)


def test_gelu_budget_where_it_binds() -> None:
    # Every float in [-5.3, -3.5]: eager's gelu is tiny there, so the absolute part of the budget
    # binds (the rational's worst over every float, 0.51 of it, is at x = -5.14).
    lo, hi = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (3.5, 5.3))
    x = -torch.arange(lo, hi + 1, dtype=torch.int32).view(torch.float32)
    gelu = run_f32(x)[0].double()
    xd = x.double()
    ref = 0.5 * xd * torch.erfc(-xd / 2**0.5)
    assert ((gelu - ref).abs() / (2e-6 + 1e-5 * ref.abs())).max() < 0.6


def test_silu_sigmoid_edges() -> None:
    x = torch.tensor([-88.0, -88.00001, -88.5, -100.0, -1e30, -INF, 88.0, 88.5, 1e30, INF, NAN, -0.0, 0.0])
    _, _, silu, sigmoid = run_f32(x)
    # down to -88.376 the exact value; below it +0 / -0 (eager gives 0 below -88.72, < 4.2e-39 above)
    assert abs(sigmoid[0].item() - 6.0546e-39) < 1e-42 and abs(sigmoid[1].item() - 6.0546e-39) < 1e-42
    assert torch.all(sigmoid[2:6] == 0) and not torch.signbit(sigmoid[2:6]).any() and torch.all(sigmoid[6:10] == 1)
    assert abs(silu[0].item() + 5.3280e-37) < 1e-40 and abs(silu[1].item() + 5.3280e-37) < 1e-40
    assert torch.all(silu[2:5] == 0) and torch.signbit(silu[2:5]).all()
    assert silu[5].isnan() and torch.equal(silu[6:10], x[6:10])
    assert sigmoid[10].isnan() and silu[10].isnan() and torch.all(sigmoid[11:] == 0.5)
    assert silu[11] == 0 and torch.signbit(silu[11]) and not torch.signbit(silu[12])


LOOPS = {"gelu": "vf_gelu_none", "erf": "vf_erf", "silu": "vf_silu", "sigmoid": "vf_sigmoid"}
MASK_OPS = re.compile(r"vcmp|vblendm|vblendv|%k[0-7]")
# A packed multiply or FMA on the tier's widest vectors (generic x86-64: SSE2 on xmm, no VEX).
PACKED = r"\t(mul|add)ps\s.*%xmm" if isa_for(None).tier is Isa.GENERIC else r"v(mul|fmadd\d*)ps\s.*%[yz]mm"


def _assembly(tmp_path: Path) -> str:
    loops = "".join(
        f'extern "C" void t_{name}(const float* __restrict x, float* __restrict y) {{\n'
        f"#pragma omp simd\n  for (int i = 0; i < 4096; ++i) y[i] = {fn}(x[i]);\n}}\n"
        for name, fn in LOOPS.items()
    )
    cpp = tmp_path / "m.cpp"
    cpp.write_text(PRELUDE + loops)
    tc = find_toolchain()
    subprocess.run([tc.cxx, *tc.flags, "-S", str(cpp), "-o", str(tmp_path / "m.s")], check=True)
    return (tmp_path / "m.s").read_text()


def test_loops_vectorize_without_masks(tmp_path: Path) -> None:
    asm = _assembly(tmp_path)
    for name in LOOPS:
        body = asm.split(f"\nt_{name}:", 1)[1].split(".cfi_endproc", 1)[0]
        assert re.search(PACKED, body) and "call" not in body, name
        masks = [line.strip() for line in body.splitlines() if MASK_OPS.search(line)]
        # gelu, erf and silu: none; sigmoid: its clamp at 88 (compare + blend, NaN kept)
        assert len(masks) <= (2 if name == "sigmoid" else 0), (name, masks)
