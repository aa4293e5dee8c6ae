"""Row sums over the prelude's inline fp32 math (tanh, erf, GELU in both forms, exp, SiLU) accumulate
through strips (`strategy.INLINE`): one chain per lane, the lane loop vectorized around the inline
function, results as eager's; a libm function (log) keeps the plain SIMD reduction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import check, hand_plan, inputs
from tests.codegen.vectorization import simd_loops_vectorized

from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule.kernel import Accumulate, Kernel

EAGER = {
    "tanh": torch.tanh,
    "erf": torch.erf,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "exp": torch.exp,
    "silu": F.silu,
    "log": torch.log,
}


def _sum_of(fn: str, rows: int, d: int) -> tuple:
    """sum(fn(x - max(x)) * y, -1) over rows of `d`: one row kernel whose second pass reduces over
    `fn` (a first pass over rows not prefetched takes strips for CHEAP bodies only)."""
    b = GraphBuilder()
    x0, y = inputs(b, ((rows, d), DType.F32), ((rows, d), DType.F32))
    x = b.add(Op.SUB, [x0, b.add(Op.AMAX, [x0], axes=(1,), keepdim=True)])
    if fn.startswith("gelu"):
        v = b.add(Op.GELU, [x], approximate="tanh" if fn == "gelu_tanh" else "none")
    else:
        v = b.add(Op[fn.upper()], [x])
    graph = b.build([b.add(Op.SUM, [b.add(Op.MUL, [v, y])], axes=(1,), keepdim=False)])
    return graph, hand_plan(graph, [[n.name for n in graph.compute_nodes]])


@pytest.mark.parametrize("fn", ["tanh", "erf", "gelu", "gelu_tanh", "exp", "silu"])
@pytest.mark.parametrize("d", [1024, 1000, 3 * 1024])
def test_inline_math_sums_through_strips(fn: str, d: int, tmp_path: Path) -> None:
    graph, plan = _sum_of(fn, 5, d)
    gen = torch.Generator().manual_seed(d)
    xs = [torch.randn(5, d, generator=gen) * 3, torch.randn(5, d, generator=gen)]
    if fn == "exp":
        xs[0] = xs[0] / 3  # sums of e^x * y stay within the float tolerance
    xs[0][1, d - 1] = float("nan")  # NaN out of the remainder or the last step
    xs[0][3, 0] = -float("inf")
    ex = check(graph, xs, plan, rtol=1e-5, atol=1e-4)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    p = k.passes[1]
    assert p.reduction.kind is Accumulate.STRIPS and p.reduction.chains == 1
    x = xs[0] - xs[0].amax(1, keepdim=True)
    want = (EAGER[fn](x) * xs[1]).sum(1)
    torch.testing.assert_close(ex(xs)[0], want, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert ex(xs)[0][1].isnan()
    simd, vectorized = simd_loops_vectorized(ex.source, tmp_path)
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"


def test_libm_math_keeps_the_plain_reduction() -> None:
    graph, plan = _sum_of("log", 3, 1024)
    xs = [torch.rand(3, 1024) + 0.5, torch.randn(3, 1024)]  # log(x - max): NaN rows, as eager
    ex = check(graph, xs, plan)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.passes[1].reduction.kind is Accumulate.SIMD
