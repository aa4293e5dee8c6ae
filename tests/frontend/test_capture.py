"""Capture paths: the Dynamo backend (by name, with options), AOT compile, errors and fallbacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vfuse
from vfuse.errors import VfuseCompileError, VfuseInputError


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y) * 0.5 + torch.sigmoid(x)


def test_backend_name_works_without_importing_vfuse() -> None:
    """The name comes from the torch_dynamo_backends entry point, so a fresh interpreter finds it."""
    code = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.relu(x) * 2, backend='vfuse')\n"
        "x = torch.randn(4, 5)\n"
        "assert torch.equal(f(x), torch.relu(x) * 2)\n"
        "import sys; assert 'vfuse' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_backend_object_records_graphs_and_stats() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(f, backend=backend)(x, y), f(x, y))
    assert backend.stats["graphs"] == 1 and backend.stats["fallbacks"] == {}
    assert len(backend.compiled[0].graph.compute_nodes) >= 4


def test_new_shapes_recompile_and_stay_correct() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    g = torch.compile(f, backend=backend)
    for shape in [(3, 4), (5, 4), (7, 4), (2, 9)]:
        x, y = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(g(x, y), f(x, y))


def test_unsupported_op_falls_back_visibly() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()

    def h(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(x), dim=1) * 2

    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.compile(h, backend=backend)(x), h(x))
    assert sum(backend.stats["fallbacks"].values()) == 1
    assert "cumsum" in next(iter(backend.stats["fallbacks"]))


def test_compiled_graph_rejects_wrong_inputs_by_name() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    torch.compile(f, backend=backend)(torch.randn(3, 4), torch.randn(3, 4))
    compiled = backend.compiled[0]
    with pytest.raises(VfuseInputError, match=r"input 1 was compiled for torch.float32\[3, 4\].*received tensor int32"):
        compiled(torch.randn(3, 4), torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(VfuseInputError, match="expected 2 inputs, got 1"):
        compiled(torch.randn(3, 4))


def test_internal_failure_warns_and_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    import vfuse.compiler

    def broken(graph, ctx):
        raise RuntimeError("planner exploded on %add (from FX node 'add')")

    monkeypatch.setattr(vfuse.compiler, "optimize", broken)
    torch._dynamo.reset()
    backend = vfuse.backend()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.warns(UserWarning, match="running it eagerly.*FX node 'add'"):
        out = torch.compile(f, backend=backend)(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert backend.stats["eager_graphs"] == 1
    torch._dynamo.reset()
    with pytest.raises(Exception, match="vfuse could not compile"):
        torch.compile(f, backend=vfuse.backend(strict=True))(x, y)
    assert issubclass(VfuseCompileError, vfuse.VfuseError)


def test_dump_writes_every_stage(tmp_path: Path) -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(dump_dir=tmp_path)
    torch.compile(f, backend=backend)(torch.randn(3, 4), torch.randn(3, 4))
    files = sorted(p.name for p in (tmp_path / "graph0").iterdir())
    assert files[:3] == ["01_fx.txt", "02_ir.txt", "03_optimized.txt"]
    assert "sigmoid(" in (tmp_path / "graph0" / "02_ir.txt").read_text()


class WithBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"y": self.bn(self.lin(x)), "aux": [x + 1]}


def test_aot_compile_keeps_output_structure_and_buffer_updates() -> None:
    torch.manual_seed(0)
    model = WithBuffers().train()
    ref = WithBuffers().train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(6, 4)
    compiled = vfuse.compile(model, (x,))
    got, expected = compiled(x), ref(x)
    torch.testing.assert_close(got["y"], expected["y"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["aux"][0], expected["aux"][0])
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean)
    with pytest.raises(
        VfuseInputError, match=r"input 0 \(x\) was compiled for torch.float32\[6, 4\].*received tensor float32\[5, 4\]"
    ):
        compiled(torch.randn(5, 4))
