"""Session 17's FMA-pipe savings in the row kernels: the fp32 erf-GELU's rational with P scaled to
a leading coefficient of 1 (its innermost step an add), and strips' sums of products accumulated
with one fma (LayerNorm's variance, RMSNorm's sum of squares). Both hold or improve accuracy:
the GELU's worst errors over every float of the regions where they bind are checked here
(the unscaled form failed each bound: 8.71e-5 relative in [-3, -1), 1.19e-6 absolute at 5.139).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
from tests.codegen.kernel_graphs import norm_graph
from tests.codegen.native_helpers import executor, hand_plan, inputs

from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule.kernel import Walk
from vfuse.schedule.strategy import UNPREFETCHED_FLOATS
from vfuse.targets import get_target
from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa


def _gelu(x: torch.Tensor) -> torch.Tensor:
    b = GraphBuilder()
    (a,) = inputs(b, ((x.numel(),), DType.F32))
    return executor(b.build([b.add(Op.GELU, [a], approximate="none")]))([x])[0]


def _floats(lo: float, hi: float, step: int = 1) -> torch.Tensor:
    """Every `step`-th float in [lo, hi) (0 <= lo < hi)."""
    a, b = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (lo, hi))
    return torch.arange(a, b, step, dtype=torch.int32).view(torch.float32)


def _ref(x: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return 0.5 * xd * torch.erfc(-xd / 2**0.5)


@pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="unfused: the unscaled form (9.7e-5 there)")
def test_gelu_relative_error_where_it_cancels() -> None:
    # x/2 + |x| e cancels for x in [-3, -1): every float there.
    x = -_floats(1.0, 3.0)
    got, ref = _gelu(x).double(), _ref(x)
    assert ((got - ref).abs() / ref.abs()).max() < 8.6e-5


@pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="the bound is the FMA form's; generic: below")
def test_gelu_absolute_error_near_the_clamp() -> None:
    # the result's rounding and e's add up where |x| is largest below the clamp: every float of
    # |x| in [5, 5.3] (the worst, 1.06e-6, is at 5.177)
    mags = _floats(5.0, 5.3)
    x = torch.cat([mags, -mags])
    assert (_gelu(x).double() - _ref(x)).abs().max() < 1.1e-6


def test_gelu_budget_everywhere_sampled() -> None:
    # every 13th float with |x| in [2^-10, 20] and both signs, plus the tails' edges: within the
    # tests' budget (atol 2e-6, rtol 1e-5), at either tier
    mags = _floats(2.0**-10, 20.0, 13)
    x = torch.cat([mags, -mags, torch.tensor([0.0, -0.0, 1e-40, -1e-40, 5.6, -5.6, 1e30, -1e30])])
    torch.testing.assert_close(_gelu(x).double(), _ref(x), rtol=1e-5, atol=2e-6)


MUL_FMA = re.compile(r"^\s+v(fn?m(add|sub)\d*|mul)ps\s")
ADD = re.compile(r"^\s+vaddps\s")


@pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="no FMA at the generic tier: other counts")
def test_gelu_fourteen_fma_pipe_operations(tmp_path: Path) -> None:
    cpp = tmp_path / "g.cpp"
    cpp.write_text(
        PRELUDE + 'extern "C" void t(const float* __restrict x, float* __restrict y) {\n'
        "#pragma omp simd\n  for (int i = 0; i < 4096; ++i) y[i] = vf_gelu_none(x[i]);\n}\n"
    )
    tc = find_toolchain()
    subprocess.run([tc.cxx, *tc.flags, "-S", str(cpp), "-o", str(tmp_path / "g.s")], check=True)
    body = (tmp_path / "g.s").read_text().split("\nt:", 1)[1].split(".cfi_endproc", 1)[0].splitlines()
    assert sum(1 for line in body if MUL_FMA.match(line)) == 14
    assert sum(1 for line in body if ADD.match(line)) == 1  # P's innermost step


@pytest.mark.parametrize(
    ("kind", "rows", "d"), [("layernorm", 7, 1024), ("layernorm", 3, 1000), ("rms", 1, 1000), ("rms", 5, 1024)]
)
def test_summed_products_accumulate_with_fma(kind: str, rows: int, d: int) -> None:
    # 1000: strips plus a remainder loop (as in test_strips.py); rows prime or 1
    graph, eager = norm_graph(kind, rows, d)
    ex = executor(graph, hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    src = ex.source[ex.source.index("// group 0") :]
    fmas = re.findall(r"(\w+_q\d+) = vf_fmaf\((\w+), (\w+), \1\);", src)
    remainder = d % 1024 != 0
    (kernel,) = [k for s in ex.program.steps for k in getattr(s, "kernels", ())]
    unprefetched = kernel.prefetch is None and kernel.walk is not Walk.ROW_GROUPS  # the machine's L1/L2 decide
    if kind == "rms" and unprefetched and UNPREFETCHED_FLOATS // get_target("cpu").simd_lanes < 2:
        # RMSNorm's one reduction is the first pass over rows not prefetched: strips of one
        # 512-bit vector only, none at 16 lanes (schedule/strategy.strip_chains): plain SIMD sums.
        assert not fmas and "reduction(+:" in src
        remainder = False  # nor a remainder loop of strips
    else:
        assert fmas and all(a == b for _, a, b in fmas), fmas
    # the remainder loop: none at 1024 (whole steps), else accumulating with fma too
    assert bool(re.search(r"(\w+_blk) = vf_fmaf\((\w+), \2, \1\);", src)) == remainder
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(rows, d, generator=gen) * 2 + 5, torch.randn(d, generator=gen), torch.randn(d, generator=gen)]
    torch.testing.assert_close(ex(xs)[0], eager(*xs), rtol=1e-5, atol=1e-5)
