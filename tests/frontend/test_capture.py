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


def test_internal_failure_warns_and_runs_eagerly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import vfuse.compiler

    # A fresh cache: a program another test kept for `f` would be loaded without planning.

    def broken(graph, ctx):
        raise RuntimeError("planner exploded on %add (from FX node 'add')")

    monkeypatch.setattr(vfuse.compiler, "optimize", broken)
    torch._dynamo.reset()
    backend = vfuse.backend(cache_dir=tmp_path)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.warns(UserWarning, match="running it eagerly.*FX node 'add'"):
        out = torch.compile(f, backend=backend)(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert backend.stats["eager_graphs"] == 1
    torch._dynamo.reset()
    with pytest.raises(Exception, match="vfuse could not compile"):
        torch.compile(f, backend=vfuse.backend(strict=True, cache_dir=tmp_path))(x, y)
    assert issubclass(VfuseCompileError, vfuse.VfuseError)


def test_dump_writes_every_stage(tmp_path: Path) -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(dump_dir=tmp_path)
    torch.compile(f, backend=backend)(torch.randn(3, 4), torch.randn(3, 4))
    (folder,) = (p for p in tmp_path.iterdir() if p.is_dir())
    files = sorted(p.name for p in folder.iterdir())
    assert files[:3] == ["01_fx.txt", "02_ir.txt", "03_optimized.txt"]
    assert "sigmoid(" in (folder / "02_ir.txt").read_text()


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


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))
        self.register_buffer("b", torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.w + self.b)


def test_calling_conventions_frozen_inference_and_none_gradients() -> None:
    """The callable handed to AOTAutograd drops frozen parameters, and puts back the None
    gradients of inputs that need none."""
    torch.manual_seed(0)
    m, x = Affine(), torch.randn(4, 8)
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True, freeze=True)
    with torch.no_grad():
        cm = torch.compile(m, backend=backend)
        for scale in (1.0, 2.0):
            torch.testing.assert_close(cm(x * scale), m(x * scale))
    assert len(backend.compiled[0].graph.inputs) == 1  # w and b are constants now
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    torch.compile(m, backend=backend)(x).square().sum().backward()  # x needs no gradient
    grad, m.w.grad = m.w.grad, None
    m(x).square().sum().backward()
    torch.testing.assert_close(grad, m.w.grad)
    assert backend.stats["graphs"] == 2  # forward and backward


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls.add_(1.0)  # an input mutation: AOTAutograd's wrappers must replay it
        return torch.tanh(x + y), x.view(-1)[:4], x


def test_inference_skips_aot_wrappers_only_when_they_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import vfuse.entry.capture as capture

    direct: list[int] = []
    unboxed = capture.unboxed
    monkeypatch.setattr(capture, "unboxed", lambda fn: direct.append(1) or unboxed(fn))
    torch._dynamo.reset()
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    with torch.no_grad():
        out = torch.compile(f, backend=vfuse.backend(strict=True))(x.T.contiguous().T, y)
        torch.testing.assert_close(out, f(x, y))
        assert direct == [1]
        m, ref = Stateful(), Stateful()
        cm = torch.compile(m, backend=vfuse.backend(strict=True))
        for _ in range(2):
            got, want = cm(x, y), ref(x, y)
        assert direct == [1]  # mutated buffer and outputs aliasing x: AOTAutograd's wrappers stay
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(m.calls, ref.calls) and got[2] is x
        got[1].fill_(7.0)  # a view of x, as in eager
        assert torch.all(x.view(-1)[:4] == 7.0)
        # One tensor passed twice: Dynamo's graph takes it once, and the direct call stays right.
        torch.testing.assert_close(torch.compile(f, backend=vfuse.backend(strict=True))(x, x), f(x, x))
