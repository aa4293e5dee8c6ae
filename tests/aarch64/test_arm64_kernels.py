"""Every kernel family's generated C++ cross-compiled for ARM64 and run under qemu, against the
reference executor (small inputs: emulation is slow)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.aarch64.cross import missing_tools, run_arm64

from vfuse import interp
from vfuse.compiler import optimize, plan, render, schedule
from vfuse.context import Context, Options
from vfuse.entry.aot import export
from vfuse.frontend.lower import lower
from vfuse.ir import Op
from vfuse.targets import get_target

pytestmark = [pytest.mark.aarch64, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]

FAMILIES: dict[str, tuple[Callable, tuple[torch.Tensor, ...]]] = {
    "pointwise": (lambda x, y: torch.relu(x + y) * torch.sigmoid(y), (torch.randn(37, 41), torch.randn(41))),
    "layernorm_gelu": (
        lambda x, w, b: F.gelu(F.layer_norm(x, (200,), w, b)),
        (torch.randn(13, 200), torch.randn(200), torch.randn(200)),
    ),
    "rmsnorm_silu": (lambda x, w: F.silu(F.rms_norm(x, (96,), w)), (torch.randn(9, 96), torch.randn(96))),
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(11, 300),)),
    "column_sum": (lambda x: x.sum(0), (torch.randn(257, 33),)),
    "view_multiaxis": (lambda x: x.view(2, 4, 4, 36).sum((2, 3)), (torch.randn(2, 16, 6, 6),)),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(10, 24), torch.tensor([[0, 9, 3], [1, 1, 7]]))),
    "int_division": (lambda a, b: a // b + a % b, (torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,)))),
    "casts_bf16": (lambda x: (x.to(torch.bfloat16) * 3).float().exp(), (torch.randn(5, 70),)),
    "dropout": (lambda x: F.dropout(x, 0.3, training=True) + 1, (torch.randn(1000),)),
}


def _compile(fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple:
    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(fn, inputs).graph_module, ctx), ctx)
    program = schedule(plan(graph, ctx), get_target("cpu"), ctx)
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
