"""The prelude's libm-free fp32 log, log2, log10, log1p, expm1, exp2, sinh and cosh (prelude_math.py).

Through compiled graphs at every instruction-set tier this CPU runs: a sweep of floats (every
4099th bit pattern, both signs, subnormals to FLT_MAX, +-inf, NaN, the regimes' edges) against
float64 math in ulps, and the edge values (NaN, +-inf, signed zeros) against float64 rounded to float. Then the reason
they exist: their loops vectorize with no call (libm alone left them scalar, libmvec differed
between a loop's vector body and its remainder), so a value computed in two loops is the same bits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tests.codegen.prelude_asm import body, prelude_asm
from tests.codegen.test_vector_math import max_ulps
from tests.kernel_families import tiers_here

import vfuse

INF, NAN = float("inf"), float("nan")
OPS = {
    "log": torch.log,
    "log2": torch.log2,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "exp2": torch.exp2,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
}
# Measured over every 257th float (docs/perf-log.md, session 25): log 0.87, log2 1.72, log10 1.85,
# log1p 0.50, expm1 1.45 ulps; session 26, this sweep: exp2 0.98, sinh 1.97, cosh 1.31.
BOUNDS = {"log": 1.0, "log2": 2.0, "log10": 2.0, "log1p": 0.51, "expm1": 1.5, "exp2": 1.0, "sinh": 2.0, "cosh": 1.5}
EDGES = [-1.0, 1.0, 2.0**-24, 2.0**-25, 2.0**-29, 89.0, 88.72283935546875, -20.0, -17.0, 1.1754943508222875e-38]
EDGES += [9.0, 89.5, 89.41598510742188, 128.0, 150.0, 2.44140625e-4]  # exp2's, sinh's and cosh's regimes


def _near(value: float, n: int = 64) -> torch.Tensor:
    bits = torch.tensor([value], dtype=torch.float32).view(torch.int32)
    return (bits + torch.arange(-n, n + 1, dtype=torch.int32)).view(torch.float32)


def sweep() -> torch.Tensor:
    every = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    every = torch.where(every >= 2**31, every - 2**32, every).to(torch.int32).view(torch.float32)
    specials = torch.tensor([INF, -INF, NAN, 0.0, -0.0, 3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -1e-45])
    return torch.cat([specials, every, *(_near(e) for e in EDGES), *(_near(-e) for e in EDGES)])


def _all(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(f(x) for f in OPS.values())


@pytest.fixture(scope="module", params=tiers_here(), ids=lambda t: t.value)
def swept(request: pytest.FixtureRequest) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = sweep()
    compiled = vfuse.compile(_all, (x,), backend="cpp", isa=request.param.value)
    source = compiled.compiled.executor.source
    for name in OPS:
        assert f"vf_{name}(" in source, name
    return x, dict(zip(OPS, compiled(x), strict=True))


def test_within_bounds_of_float64(swept: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> None:
    x, got = swept
    for name, f in OPS.items():
        assert max_ulps(got[name], f(x.double())) <= BOUNDS[name], name


def test_edge_values_like_float64(swept: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> None:
    """NaN, +-inf and zeros where float64 rounded to float has them (eager's sinh and cosh overflow
    from 88.72, below the float range's end at 89.42)."""
    x, got = swept
    for name, f in OPS.items():
        want = f(x.double()).float()
        assert torch.equal(torch.isnan(got[name]), torch.isnan(want)), name
        # Exact zeros only where x is one (eager's log1p of the smallest subnormal is 0, as vfuse's x).
        same = torch.isinf(want) | torch.isinf(got[name]) | (x == 0)
        assert torch.equal(got[name][same], want[same]), name
        assert torch.equal(torch.signbit(got[name][same]), torch.signbit(want[same])), name


LOOP = "\n#pragma omp simd\n  for (int i = 0; i < 4096; ++i) y[i] = vf_{0}(x[i]);\n}}\n"


def test_loops_vectorize_without_calls(tmp_path: Path) -> None:
    """Each function's loop has packed arithmetic and no call at the machine's own tier."""
    loops = "".join(
        f'extern "C" void t_{name}(const float* __restrict x, float* __restrict y) {{' + LOOP.format(name)
        for name in OPS
    )
    asm = prelude_asm(tmp_path, loops)
    for name in OPS:
        code = body(asm, f"t_{name}")
        assert "call" not in code, name
        assert re.search(r"\tv?(mul|add|sub|div|fmadd\d*)p[sd]\s", code), name
