"""Native code vfuse cannot build is a bug, and is never hidden.

A Swin training graph made g++ fail (`redeclaration of 'const float t5_rcp'`: two passes of
one row divided by the same row scalar and each declared its reciprocal under the same name),
and the graph quietly ran on the reference executor. With raise_codegen_errors (set for the
whole suite by tests/conftest.py) such a failure raises VfuseCodegenError; without it the
graph still runs, with a warning naming the graph and the error, and the stats count it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import vfuse
from vfuse import compiler
from vfuse.codegen.cpp import CompilerNotFound
from vfuse.errors import VfuseCodegenError


def _shared_divisor(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    # y = x / sum(x) is cheap, so both later passes recompute it, each with 1 / sum(x).
    y = x / x.sum(-1, keepdim=True)
    return y * (g - (g * y).sum(-1, keepdim=True))


@pytest.mark.parametrize("shape", [(8, 300), (3, 1031), (1, 257)])
def test_passes_sharing_a_divisor_compile(shape: tuple[int, int]) -> None:
    xs = [torch.rand(shape) + 0.5, torch.randn(shape)]
    compiled = vfuse.compile(_shared_divisor, xs, raise_codegen_errors=True)
    assert compiled.stats.backend == "cpp"
    torch.testing.assert_close(compiled(*xs), _shared_divisor(*xs), rtol=1e-5, atol=1e-6)


class PooledHead(nn.Module):
    """Swin's head: LayerNorm over tokens, mean pool, linear. Its backward's row kernel divides
    by the pool's 16 in both of its passes (the graph that failed)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.drop, self.head = nn.LayerNorm(64), nn.Dropout(0.0), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.norm(x).mean(1)))


def test_training_graph_of_swins_head_runs_natively() -> None:
    torch.manual_seed(0)
    model, x = PooledHead().train(), torch.randn(2, 16, 64, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    with torch.no_grad():
        model.norm.weight.normal_(), model.norm.bias.normal_()
    backend = vfuse.backend(raise_codegen_errors=True)
    torch.compile(model, backend=backend, dynamic=False)(x).square().sum().backward()
    got = [x.grad, *(p.grad.clone() for p in model.parameters())]
    model.zero_grad()
    model(ref).square().sum().backward()
    for i, (a, b) in enumerate(zip(got, [ref.grad, *(p.grad for p in model.parameters())], strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"gradient {i}: {m}")
    assert len(backend.compiled) == 2 and all(c.stats.backend == "cpp" for c in backend.compiled)


def _f(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * 2


@pytest.fixture
def broken_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated code that g++ rejects."""
    monkeypatch.setattr(compiler, "render_cpp", lambda program: "this is not C++;\n")


def test_code_the_compiler_rejects_raises_when_asked(broken_cpp: None, tmp_path: Path) -> None:
    x = torch.randn(4, 5)
    with pytest.raises(VfuseCodegenError, match=r"for aot0 failed: .* failed on .*\.cpp"):
        vfuse.compile(_f, [x], raise_codegen_errors=True, cache_dir=tmp_path)
    torch._dynamo.reset()
    # Dynamo wraps what a backend raises; the vfuse error must reach it, not be swallowed by
    # the backend's own fallback to eager.
    with pytest.raises(Exception, match="VfuseCodegenError: vfuse: native code generation for graph0"):
        torch.compile(_f, backend=vfuse.backend(raise_codegen_errors=True, cache_dir=tmp_path))(x)


def test_code_the_compiler_rejects_falls_back_visibly(broken_cpp: None, tmp_path: Path) -> None:
    x = torch.randn(4, 5)
    with pytest.warns(UserWarning, match="native code for aot0 failed .*CompileError"):
        compiled = vfuse.compile(_f, [x], raise_codegen_errors=False, cache_dir=tmp_path)
    torch.testing.assert_close(compiled(x), _f(x))
    assert compiled.stats.backend == "interp" and compiled.stats.native_error.startswith("CompileError")
    torch._dynamo.reset()
    backend = vfuse.backend(raise_codegen_errors=False, cache_dir=tmp_path)
    with pytest.warns(UserWarning, match="native code for graph0 failed"):
        torch.testing.assert_close(torch.compile(_f, backend=backend)(x), _f(x))
    assert backend.stats["reference_graphs"] == 1 and backend.stats["eager_graphs"] == 0


def test_an_exception_while_generating_code_is_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(program: object) -> str:
        raise KeyError("t7")

    monkeypatch.setattr(compiler, "render_cpp", fail)
    with pytest.raises(VfuseCodegenError, match="aot0 failed: 't7'"):
        vfuse.compile(_f, [torch.randn(3)], raise_codegen_errors=True)


def test_a_missing_compiler_is_not_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(cxx: str | None = None, isa: object = None) -> None:
        raise CompilerNotFound("no g++ here")

    monkeypatch.setattr(compiler, "find_toolchain", missing)
    x = torch.randn(3, 7)
    with pytest.warns(UserWarning, match="native code for aot0 is not available: CompilerNotFound: no g"):
        compiled = vfuse.compile(_f, [x], raise_codegen_errors=True)
    torch.testing.assert_close(compiled(x), _f(x))
    assert compiled.stats.native_error == "CompilerNotFound: no g++ here"
