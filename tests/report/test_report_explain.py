"""vfuse.explain through the real pipeline (torch.export, lowering, freezing, passes, planner,
schedule): the kernels it reports are the kernels a compiled graph runs, with every option."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.ir import Op
from vfuse.report import FusionReport, RunKind


def add_relu_scale(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y) * 2.0


def runs(stats: object) -> tuple[int, int, int]:
    return (stats.kernels, stats.native_calls, stats.torch_calls)  # type: ignore[attr-defined]


def report_runs(r: FusionReport) -> tuple[int, int, int]:
    return (r.num_kernels, r.native_calls, r.torch_calls)


def test_explain_reports_the_plan() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    r = vfuse.explain(add_relu_scale, x, y, target="H100")
    assert isinstance(r, FusionReport)
    assert r.target == r.plan.target == "h100"  # the name normalized, as the options do
    assert report_runs(r) == (1, 1, 0) and len(r.plan.groups) == 1
    assert r.bytes_fused == sum(g.cost.bytes for g in r.plan.groups)
    assert r.bytes_lower_bound == 3 * 4 * 8 * 4  # x and y read once, the result written once
    assert r.bytes_lower_bound <= r.bytes_fused <= r.bytes_unfused
    assert r.time_unfused_s is not None  # the cost model priced every op alone
    assert r.fallbacks == {}
    assert {n.name for n in r.graph.compute_nodes} <= {n for k in r.kernels for n in k.nodes}
    (k,) = r.kernels
    assert k.pattern == "pointwise chain (add > relu > mul)"
    assert "void k0(" in r.kernel_source(k)  # the generated C++ of exactly this kernel


def test_reference_executor_counts_like_the_runtime() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    r = vfuse.explain(add_relu_scale, x, y, backend="interp")
    compiled = vfuse.compile(add_relu_scale, (x, y), backend="interp")
    assert report_runs(r) == runs(compiled.stats) == (0, 0, 4)  # add, relu, the scalar 2.0 (full), mul
    assert r.backend == "interp" and all(k.runs is RunKind.TORCH for k in r.kernels)


def test_dumps_do_not_overwrite(tmp_path: Path) -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    for _ in range(2):
        vfuse.explain(add_relu_scale, x, y, dump_dir=tmp_path)
    folders = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 2 and all(f.name.endswith("-explain0") for f in folders)
    assert all((f / "05_program.txt").is_file() and (f / "06_kernels.cpp").is_file() for f in folders)
    assert (tmp_path / "index.txt").read_text().count("explain0\texplain\t") == 2


class SmallCNN(nn.Module):
    """conv-BN-ReLU, an adaptive max pool (a torch fallback), conv-BN-ReLU: the issue's case."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_max_pool2d(F.relu(self.bn1(self.conv1(x))), 6)
        return F.relu(self.bn2(self.conv2(x)))


def test_freeze_reports_what_the_frozen_graph_runs() -> None:
    torch.manual_seed(0)
    model, x = SmallCNN().eval(), torch.randn(2, 3, 12, 12)
    frozen = vfuse.explain(model, x, freeze=True)
    with torch.no_grad():
        compiled = vfuse.compile(model, (x,), freeze=True, strict=True)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert report_runs(frozen) == runs(compiled.stats) == (2, 2, 2)  # pool and its get_item through torch
    # Frozen, BatchNorm is folded into the convolutions; unfrozen, its ops are still there.
    assert not any(n.op is Op.RSQRT for n in frozen.graph.nodes)
    assert any(n.op is Op.RSQRT for n in vfuse.explain(model, x).graph.nodes)
    patterns = [(k.pattern, k.module) for k in frozen.kernels]
    assert patterns[0] == ("Conv2d+BatchNorm2d+ReLU conv epilogue", "conv1")
    assert patterns[1] == ("torch: aten.adaptive_max_pool2d", "SmallCNN")


@pytest.mark.parametrize("freeze", [False, True])
def test_demo_model_report_equals_runtime(freeze: bool) -> None:
    from vfuse.demo.model import example

    model, x = example(batch=2, tokens=16, d=64, heads=4)
    r = vfuse.explain(model, x, freeze=freeze)
    backend = vfuse.backend(strict=True, freeze=freeze)
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    (compiled,) = backend.compiled
    assert report_runs(r) == runs(compiled.stats)
    assert r.num_kernels > r.num_groups  # the attention group runs as several kernels
    patterns = {k.pattern: k.module for k in r.kernels}
    assert patterns["LayerNorm row kernel"] in ("ln1", "ln2")
    assert patterns["Linear+GELU GEMM epilogue"] == "fc"
    assert "attention" in patterns
    for k in r.kernels:
        assert f" {k.name}(" in r.kernel_source(k)


def test_the_report_names_the_instruction_set_tier() -> None:
    import vfuse
    from vfuse.compiler import target_of
    from vfuse.context import Context, Options

    report = vfuse.explain(lambda x: torch.softmax(x, -1) * 2, torch.randn(8, 64))
    tier = target_of(Context(Options.from_env())).isa_description
    assert tier and report.isa == tier
    assert f"(target: cpu, {tier})" in str(report)


def test_explain_follows_the_triton_backend() -> None:
    """As compile_fx: the GEMM (its GELU fused) and the softmax as Triton kernels, none through torch."""
    import vfuse

    fn = lambda x, w: torch.nn.functional.gelu(x @ w).softmax(-1)  # noqa: E731
    report = vfuse.explain(fn, torch.randn(8, 16), torch.randn(16, 32), target="h100", backend="triton")
    assert report.backend == "triton" and report.isa == ""
    assert report.torch_calls == 0 and "matmul template" in report.source
