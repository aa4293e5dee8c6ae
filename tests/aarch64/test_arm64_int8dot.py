"""The int8 dot-product GEMM for an ARM64 CPU with the dot-product extension (`sdot`), cross-compiled
and run under qemu: against the exact value (float64 of the integer sum times the scales) and eager."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.aarch64.cross import missing_tools, run_arm64

from vfuse.compiler import optimize, plan, render, schedule
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.frontend.lower import lower
from vfuse.schedule.kernel import ContractionKernel, DotKind
from vfuse.targets import get_target
from vfuse.targets.cpu import at_tier
from vfuse.targets.isa import ARM, CpuIsa, Isa, IsaExtra

pytestmark = [pytest.mark.aarch64, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]


@pytest.mark.parametrize(("m", "k", "n", "za", "zw"), [(13, 37, 29, 3.0, 0.0), (9, 64, 12, -128.0, 5.0)])
def test_sdot_qlinear_on_arm64(m: int, k: int, n: int, za: float, zw: float, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(m)
    xq, wq = (torch.randint(-128, 128, s, generator=g, dtype=torch.int8) for s in ((m, k), (n, k)))
    ws = torch.rand(n, generator=g) * 0.02 + 0.001

    def fn(xq: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        return F.linear((xq.float() - za) * 0.037, (wq.float() - zw) * ws[:, None])

    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(fn, (xq, wq, ws)).graph_module, ctx), ctx)
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset({IsaExtra.DOTPROD}), ARM))
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    (kern,) = [kk for kk in program.kernels if isinstance(kk, ContractionKernel)]
    assert kern.int8 is not None and kern.int8.kind is DotKind.SDOT
    source = render(program, ctx)
    assert "sdot %0.4s" in source
    got = run_arm64(program, graph, source, (xq, wq, ws), [], tmp_path)[graph.outputs[0]]
    exact = ((xq.double() - za) @ (wq.double() - zw).T) * 0.037 * ws.double()
    torch.testing.assert_close(got, exact.float(), rtol=2e-7, atol=1e-30)
    torch.testing.assert_close(got, fn(xq, wq, ws), rtol=1e-5, atol=1e-5 * float(exact.abs().max()))
