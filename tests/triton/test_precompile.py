"""A device's first call compiles every kernel of the program at once, in a thread pool, before
launching any (`offline.precompile`, wired in `TritonExecutor._allocate` for CUDA): checked with a
barrier only concurrent compiles pass, for sm_90 without a GPU (each kernel's key equals the one
Triton's JIT computes at a launch with aligned pointers, so that launch reads the cache), and the
executor's wiring with a fake on CPU."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.triton.triton_cases import compile_triton

from vfuse.codegen.triton.module import load_module
from vfuse.codegen.triton.offline import precompile

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key  # noqa: E402


def _rows_and_columns(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(x, -1), x.sum(0)


X = torch.randn(7, 13)


def _executor(tmp_path: Path) -> Any:
    compiled = compile_triton(_rows_and_columns, (X,), cache_dir=tmp_path)
    return compiled, compiled.compiled.executor


def test_kernels_compile_concurrently_once_each(tmp_path: Path) -> None:
    _, e = _executor(tmp_path)
    assert len({ln.fn for ln in e.rendered.launches}) >= 2
    barrier = threading.Barrier(2, timeout=30)
    calls: list[tuple[str, int, int, int]] = []

    def fake(module: Any, fn: str, sig: Any, warps: int, sm: int, stages: int) -> str:
        calls.append((fn, warps, sm, stages))
        if len(calls) <= 2:
            barrier.wait()  # serial compiles would break the barrier (and raise in `result`)
        return fn

    out = precompile(e.rendered, e.path, 90, workers=2, compile_fn=fake)
    assert sorted(c[0] for c in calls) == sorted({ln.fn for ln in e.rendered.launches})
    assert all(f.result() == key[0] for key, f in out.items())
    assert {c[2] for c in calls} == {90}


def test_precompiled_kernels_have_the_keys_the_jit_computes(tmp_path: Path) -> None:
    _, e = _executor(tmp_path)
    out = precompile(e.rendered, e.path, 90, workers=2)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    module = load_module(e.path, interpret=False)  # another load: the runtime's own module object
    for (fn, warps, stages), f in out.items():
        sig = e.rendered.signatures[fn]
        attrs = {(i,): backend.parse_attr("D") for i in range(len(sig))}
        opts = {
            "num_warps": warps,
            "debug": False,
            "instrumentation_mode": triton.knobs.compilation.instrumentation_mode,
        }
        options = backend.parse_options({**opts, **({"num_stages": stages} if stages else {})})
        key = get_cache_key(
            ASTSource(getattr(module, fn), sig, {}, attrs), backend, options, get_cache_invalidating_env_vars()
        )
        assert hashlib.sha256(key.encode()).hexdigest() == f.result().hash, fn


def test_the_first_call_on_a_device_precompiles_once(tmp_path: Path) -> None:
    compiled, e = _executor(tmp_path)
    seen: list[tuple[Any, Path, int]] = []
    e.precompiled_devices = ("cpu",)
    e.precompile = lambda rendered, path, sm: seen.append((rendered, path, sm))
    for _ in range(2):
        for got, want in zip(compiled(X), _rows_and_columns(X), strict=True):
            torch.testing.assert_close(got, want)
    assert seen == [(e.rendered, e.path, 90)]
    assert compile_triton(_rows_and_columns, (X,)).compiled.executor.precompiled_devices == ("cuda",)


def test_a_single_kernel_is_left_to_its_launch(tmp_path: Path) -> None:
    e = compile_triton(torch.sigmoid, (X,), cache_dir=tmp_path).compiled.executor
    assert len(e.rendered.launches) == 1
    assert precompile(e.rendered, e.path, 90, compile_fn=lambda *a: pytest.fail("nothing to overlap")) == {}
