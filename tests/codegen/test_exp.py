"""The prelude's inline fp32 exp (vf_exp) and the sigmoid / SiLU built on it, run natively.

Every result is compared with float64 math rounded once to float32: within a few ulp for
normal results and subnormal spacing for subnormal ones, exactly for the edge values (inf,
0, NaN, signs of zero). Overflow to +inf and underflow to 0 must happen exactly where the
correctly rounded result is inf or 0. fp32 sigmoid and silu clamp exp's argument at -88 and
saturate 1 + exp(-x) to +inf below x = -88.376: +0 / -0 there (eager gives 0 below -88.72; the
exact values there are < 4.2e-39).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import executor, inputs
from tests.frontend.lowering_helpers import lower_fn, run_native
from tests.kernel_families import tiers_here

import vfuse
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.targets.isa import Isa

INF, NAN = float("inf"), float("nan")
# sigmoid/silu: 1 + exp(-x) is +inf (n = 128) from this x down; the next float up is finite
SATURATES = -88.37627410888672
SPECIALS = [INF, -INF, NAN, 0.0, -0.0, 3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -1e-45, 1.0, -1.0]
# float32 bit patterns around which exp changes regime: overflow (88.72), normal/subnormal
# (-87.34), the smallest subnormal (-103.28), rounding to 0 (-103.97), and vf_exp's own
# range selects (89, -150), sigmoid/silu's clamp (+-88) and saturation (-88.376); each also negated.
BOUNDARIES = [88.72283935546875, -87.33654022216797, -103.27892303466797, -103.97207641601562, 89.0, -150.0, 88.0]
BOUNDARIES += [SATURATES]


def _near(value: float, n: int = 300) -> torch.Tensor:
    bits = torch.tensor([value], dtype=torch.float32).view(torch.int32)
    return (bits + torch.arange(-n, n + 1, dtype=torch.int32)).view(torch.float32)


def sweep() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), generator=g, dtype=torch.int32)
    parts = [
        torch.tensor(SPECIALS),
        torch.linspace(-110.0, 95.0, 1 << 20),  # every regime, spacing 2e-4
        torch.linspace(-1.0, 1.0, 1 << 14),
        *(_near(b) for b in BOUNDARIES),
        *(_near(-b) for b in BOUNDARIES),
        random_bits.view(torch.float32),  # huge magnitudes, NaN payloads, subnormal inputs
    ]
    return torch.cat(parts)


def ulp_error(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Max error in float32 ulps of the exact value, over normal and over subnormal results."""
    finite = torch.isfinite(exact) & (exact != 0) & torch.isfinite(got)
    _, e = torch.frexp(exact[finite])
    ulp = torch.ldexp(torch.ones_like(exact[finite]), (e - 24).clamp_min(-149))
    err = (got[finite].double() - exact[finite]).abs() / ulp
    normal = exact[finite].abs() >= torch.finfo(torch.float32).tiny
    return err[normal].max().item(), err[~normal].max().item()


def assert_edges_exact(got: torch.Tensor, exact: torch.Tensor) -> None:
    """NaN, +-inf and +-0 exactly where float64 math rounded to float32 has them."""
    want = exact.float()
    edge = torch.isnan(want) | torch.isinf(want) | (want == 0) | torch.isnan(got) | torch.isinf(got) | (got == 0)
    g, w = got[edge], want[edge]
    assert torch.equal(torch.isnan(g), torch.isnan(w))
    ok = ~torch.isnan(w)
    assert torch.equal(g[ok], w[ok]), (g[ok] != w[ok]).nonzero()
    assert torch.equal(torch.signbit(g[ok]), torch.signbit(w[ok]))


def run_f32(x: torch.Tensor) -> list[torch.Tensor]:
    b = GraphBuilder()
    (a,) = inputs(b, ((x.numel(),), DType.F32))
    graph = b.build([b.add(op, [a]) for op in (Op.EXP, Op.SIGMOID, Op.SILU)])
    return executor(graph)([x])


def _exp_sigmoid_silu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.exp(x), torch.sigmoid(x), F.silu(x)


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
def test_exp_sigmoid_silu_over_every_regime(tier: Isa) -> None:
    """At every tier: the polynomial's evaluation order and fmas (the generic tier has none)."""
    x = sweep()
    compiled = vfuse.compile(_exp_sigmoid_silu, (x,), backend="cpp", isa=tier.value)
    assert all(f"{f}(" in compiled.compiled.executor.source for f in ("vf_exp", "vf_sigmoid", "vf_silu"))
    exp, sigmoid, silu = compiled(x)
    xd = x.double()
    exact = {"exp": torch.exp(xd), "sigmoid": 1 / (1 + torch.exp(-xd)), "silu": xd / (1 + torch.exp(-xd))}
    # measured over all 2^32 floats (sigmoid, silu: x >= -88), Horner's polynomial: exp 1.01 / 0.75,
    # sigmoid 2.48 / 0.98, silu 2.40 / 0.50; Estrin's, over this sweep: 1.02 / 0.75, 2.47 / 0.95, 2.36 / 0.50;
    # every float in [-88.376, -88): sigmoid 0.73 of subnormal spacing, silu 1.50 ulp
    bounds = {"exp": (2.0, 1.0), "sigmoid": (3.0, 1.0), "silu": (3.0, 1.0)}
    below = x <= SATURATES  # sigmoid and silu: exactly +0 and -0 there (NaN for silu(-inf))
    for name, got in (("exp", exp), ("sigmoid", sigmoid), ("silu", silu)):
        keep = ~below if name != "exp" else torch.ones_like(below)
        assert_edges_exact(got[keep], exact[name][keep])
        normal, subnormal = ulp_error(got[keep], exact[name][keep])
        assert normal <= bounds[name][0] and subnormal <= bounds[name][1], (name, normal, subnormal)
    assert torch.all(sigmoid[below] == 0) and not torch.signbit(sigmoid[below]).any()
    finite = below & torch.isfinite(x)
    assert torch.all(silu[finite] == 0) and torch.signbit(silu[finite]).all() and silu[x == -INF].isnan().all()
    # and against eager: exp everywhere; sigmoid/silu where eager's exp(-x) does not overflow
    torch.testing.assert_close(exp, torch.exp(x), rtol=1e-6, atol=1e-44, equal_nan=True)
    mid = x.abs() < 87
    torch.testing.assert_close(sigmoid[mid], torch.sigmoid(x[mid]), rtol=1e-6, atol=0)
    torch.testing.assert_close(silu[mid], F.silu(x[mid]), rtol=1e-6, atol=0)


def test_edge_values_exactly() -> None:
    x = torch.tensor([-INF, INF, NAN, 0.0, -0.0, 88.72283172607422, 88.72283935546875, -103.972, -104.0, -100.0, 100.0])
    x = torch.cat([x, torch.tensor([-88.0, -88.00001, 88.0, 1e30, -1e30, SATURATES])])
    x = torch.cat([x, x[-1:].view(torch.int32).sub(1).view(torch.float32)])  # the next float up
    exp, sigmoid, silu = run_f32(x)
    assert exp[:5].tolist()[:2] == [0.0, INF] and exp[2].isnan() and exp[3] == exp[4] == 1.0
    assert 3.40279e38 < exp[5] < INF and exp[6] == INF  # the last float with a finite exp, the next
    assert exp[7] == 1.401298464324817e-45 and exp[8] == 0.0  # min subnormal, then 0
    assert sigmoid.tolist()[:2] == [0.0, 1.0] and sigmoid[2].isnan() and sigmoid[3] == sigmoid[4] == 0.5
    assert sigmoid[9] == 0.0 and sigmoid[10] == 1.0  # fp32 sigmoid is 0 below -88.376, as eager's below -88.72
    assert abs(sigmoid[11].item() - 6.0546e-39) < 1e-42 and abs(sigmoid[12].item() - 6.0546e-39) < 1e-42
    assert sigmoid[13] == 1.0 and sigmoid[14] == 1.0 and sigmoid[15] == 0.0
    assert abs(sigmoid[17].item() - 4.1560e-39) < 1e-42 and sigmoid[16] == 0 and not torch.signbit(sigmoid[16])
    assert abs(silu[11].item() + 5.3280e-37) < 1e-40 and abs(silu[12].item() + 5.3280e-37) < 1e-40
    assert silu[16] == 0 and torch.signbit(silu[16]) and abs(silu[17].item() + 3.6729e-37) < 1e-40
    assert silu[13] == 88.0 and silu[14] == 1e30 and silu[15] == 0 and torch.signbit(silu[15])
    assert silu[9] == 0 and torch.signbit(silu[9])
    # silu(-inf) is NaN as in eager (-inf * sigmoid(-inf) = -inf * 0); silu(-0) keeps its sign
    assert silu[0].isnan() and silu[1] == INF and silu[2].isnan()
    assert silu[4] == 0 and torch.signbit(silu[4]) and not torch.signbit(silu[3])


def test_f64_keeps_libm_exp() -> None:
    b = GraphBuilder()
    (a,) = inputs(b, ((4099,), DType.F64))
    graph = b.build([b.add(op, [a]) for op in (Op.EXP, Op.SIGMOID, Op.SILU)])
    x = torch.cat([torch.linspace(-750.0, 720.0, 4096, dtype=torch.float64), torch.tensor([-INF, INF, NAN])])
    exp, sigmoid, silu = executor(graph)([x])
    torch.testing.assert_close(exp, torch.exp(x), rtol=1e-15, atol=0, equal_nan=True)
    torch.testing.assert_close(sigmoid, torch.sigmoid(x), rtol=1e-15, atol=1e-300, equal_nan=True)
    torch.testing.assert_close(silu, F.silu(x), rtol=1e-15, atol=1e-300, equal_nan=True)


def test_softmax_masked_entries_are_exact_zeros() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 1000, generator=g) * 8
    x[torch.rand(48, 1000, generator=g) < 0.3] = -INF
    x[1, 1:], x[1, 0] = -INF, 2.0  # one finite entry: exactly 1
    x[2] = -INF  # nothing finite: NaN, as in eager
    x[3, :500] = -90.0  # exp(-90 - max) is subnormal or 0

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t, -1)

    (got,) = run_native(lower_fn(fn, [x]), [x])
    want = fn(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9, equal_nan=True)
    masked = torch.isinf(x) & (torch.arange(48) != 2)[:, None]
    assert torch.all(got[masked] == 0) and not torch.signbit(got[masked]).any()
    assert got[1, 0] == 1.0 and got[2].isnan().all()
