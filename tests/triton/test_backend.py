"""backend="triton" as an option: accepted with a GPU target only, through vfuse.compile and
torch.compile, dumps its module and GPU decisions, exposes its kernels; triton stays out of the CPU
path's imports and TRITON_INTERPRET out of the environment; the cached module is rewritten when
its file differs from the source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

import vfuse
from vfuse.codegen.triton.module import module_path
from vfuse.errors import VfuseOptionError

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


def test_triton_needs_a_gpu_target() -> None:
    with pytest.raises(VfuseOptionError, match="target='cpu' is not accepted; accepted: 'a100', 'h100', 'h200'"):
        vfuse.compile(torch.relu, (torch.randn(3),), backend="triton")
    with pytest.raises(VfuseOptionError, match="'triton'"):
        vfuse.compile(torch.relu, (torch.randn(3),), backend="cuda")


def test_torch_compile_with_the_triton_backend() -> None:
    backend = vfuse.backend(backend="triton", target="a100", strict=True)
    fn = torch.compile(lambda x, w: F.rms_norm(x * 2, (16,), w), backend=backend, dynamic=False)
    x, w = torch.randn(5, 16), torch.randn(16)
    torch.testing.assert_close(fn(x, w), F.rms_norm(x * 2, (16,), w))
    (graph,) = backend.compiled
    assert graph.stats.backend == "triton" and graph.stats.kernels == 1


def test_dumps_the_module_and_the_gpu_decisions(tmp_path: Path) -> None:
    x = torch.randn(4, 33)
    compile_triton(lambda t: torch.softmax(t, -1), (x,), dump_dir=tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    program = (folder / "05_program.txt").read_text()
    assert "gpu rows, 1 rows x 64 per program (persistent), 1 warps, 4 programs" in program
    assert "def k0(" in (folder / "06_kernels.py").read_text()


def test_kernels_expose_source_and_resources() -> None:
    x = torch.randn(4, 33)
    (k,) = compile_triton(lambda t: torch.softmax(t, -1), (x,)).compiled.executor.kernels
    assert k.name == "k0" and f"def {k.name}(" in k.source and "@triton.jit" not in k.source
    assert k.resources()["spill_bytes"] == 0


def test_cpu_path_imports_no_triton_and_interpreting_sets_no_environment() -> None:
    code = "import sys, vfuse, vfuse.compiler, vfuse.runtime.triton; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    before = os.environ.get("TRITON_INTERPRET")
    x = torch.randn(3, 4)
    torch.testing.assert_close(compile_triton(torch.sigmoid, (x,))(x), torch.sigmoid(x))
    assert os.environ.get("TRITON_INTERPRET") == before


def test_a_changed_cache_file_is_rewritten_before_import(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    compiled = compile_triton(torch.sigmoid, (x,), cache_dir=tmp_path)
    path = module_path(compiled.compiled.executor.source, tmp_path)
    assert path.parent == tmp_path / "triton" and (path.parent.stat().st_mode & 0o077) == 0  # only this user writes
    path.write_text("raise RuntimeError('planted')\n")
    again = compile_triton(torch.sigmoid, (x,), cache_dir=tmp_path)
    torch.testing.assert_close(again(x), torch.sigmoid(x))
    assert path.read_text() == again.compiled.executor.source
