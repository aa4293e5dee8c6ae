"""Real torch code, lowered by the frontend, plans to the expected kernels."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.fusion.fusion_patterns import FIXED_CPU, check_plan, labels
from torch.fx.experimental.proxy_tensor import make_fx

from vfuse.context import Context
from vfuse.frontend import decompositions, lower
from vfuse.fusion import lower_bound_bytes, plan_fusion
from vfuse.ir import Graph
from vfuse.passes import optimize
from vfuse.targets import get_target


def _lower(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Graph:
    gm = make_fx(fn, decomposition_table=decompositions.decomposition_table(), tracing_mode="fake")(*inputs)
    return lower.lower(gm, Context())


class RMSNorm(torch.nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _layer_norm() -> Graph:
    ln = torch.nn.LayerNorm(256)
    return _lower(lambda x, w, b: F.layer_norm(x, (256,), w, b, ln.eps), torch.randn(32, 256), ln.weight, ln.bias)


def _rms_norm_silu() -> Graph:
    m = RMSNorm(256)
    return _lower(
        lambda x, w: F.silu(torch.func.functional_call(m, {"weight": w}, (x,))), torch.randn(32, 256), m.weight
    )


def _softmax() -> Graph:
    return _lower(lambda x: torch.softmax(x, dim=-1), torch.randn(64, 128))


def _linear_gelu() -> Graph:
    x, w, b = torch.randn(64, 128), torch.randn(256, 128), torch.randn(256)
    return _lower(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)


@pytest.mark.parametrize("target", [FIXED_CPU, get_target("h100")], ids=lambda t: t.name)
@pytest.mark.parametrize(
    ("build", "label"),
    [(_layer_norm, "row"), (_rms_norm_silu, "row"), (_softmax, "row"), (_linear_gelu, "gemm")],
    ids=["layer_norm", "rms_norm_silu", "softmax", "linear_gelu"],
)
def test_lowered_module_is_one_kernel(build: Callable[[], Graph], label: str, target: object) -> None:
    graph = optimize(build())  # RMSNorm's x.pow(2) becomes x * x there, as in every compile
    plan = plan_fusion(graph, target)  # type: ignore[arg-type]
    check_plan(plan)
    assert labels(plan) == [label]
    assert plan.groups[0].cost.bytes <= 1.15 * lower_bound_bytes(graph)
