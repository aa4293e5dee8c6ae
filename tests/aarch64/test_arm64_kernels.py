"""Every kernel family's generated C++ cross-compiled for ARM64 and run under qemu, against the
reference executor (small inputs: emulation is slow)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.aarch64.cross import missing_tools, run_arm64
from tests.kernel_families import FAMILIES

from vfuse import interp
from vfuse.compiler import optimize, plan, render, schedule
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.frontend.lower import lower
from vfuse.ir import Op
from vfuse.schedule.kernel import Kernel
from vfuse.targets import get_target
from vfuse.targets.cpu import at_tier
from vfuse.targets.isa import ARM, CpuIsa, Isa

pytestmark = [pytest.mark.aarch64, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]


def _compile(fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple:
    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(fn, inputs).graph_module, ctx), ctx)
    # Scheduled as for an ARM64 CPU with this one's caches: 4 fp32 lanes (NEON's 128-bit vectors).
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset(), ARM))
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    assert (program.isa, program.vector_width) == (Isa.NEON, 4)
    return graph, program, render(program, ctx)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_on_arm64_matches_the_reference(family: str, tmp_path: Path) -> None:
    fn, inputs = FAMILIES[family]
    graph, program, source = _compile(fn, inputs)
    rng_nodes = [n for n in graph.nodes if n.op is Op.RNG_SEED]
    torch.manual_seed(0)
    drawn = {n.name: int(interp.run_node(n, [])) for n in rng_nodes}
    got = run_arm64(program, graph, source, inputs, [drawn[s] for s in program.seeds], tmp_path)
    torch.manual_seed(0)
    want = interp.run(graph, list(inputs))
    for name, w in zip(graph.outputs, want, strict=True):
        torch.testing.assert_close(got[name], w, rtol=2e-3, atol=2e-3, msg=lambda m, n=name: f"output %{n}: {m}")


def test_layer_norm_moments_on_arm64(tmp_path: Path) -> None:
    """LayerNorm's two sums as one pass of per-lane moments (codegen/cpp/moments.py) in NEON's
    4-lane vectors: decided for rows past the LLC, here a 64 KiB one."""
    x = torch.randn(40, 320) * 3 + torch.randn(40, 1) * 100
    x[1] = 7.0  # variance 0
    inputs = (x, torch.randn(320), torch.randn(320))
    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(_layer_norm, inputs).graph_module, ctx), ctx)
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset(), ARM))
    neon = dataclasses.replace(neon, l3_bytes=64 << 10)
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    assert [k.moments for k in program.kernels if isinstance(k, Kernel)] == [(4, 4)]
    got = run_arm64(program, graph, render(program, ctx), inputs, [], tmp_path)
    (name,) = graph.outputs
    torch.testing.assert_close(got[name], interp.run(graph, list(inputs))[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(got[name][1], inputs[2])  # the constant row's mean is exact: 0 * w + b


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
