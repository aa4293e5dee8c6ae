"""The lean per-call path of Triton programs (runtime/triton_lean.py), forced onto the CPU (it runs
on CUDA devices): for every kernel family whose program qualifies (kernels only, no fault records,
every graph output written by a kernel), the lean call gives exactly the general path's results,
allocates fresh outputs per call (or the static ones), and programs that do not qualify keep the
general path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.kernel_families import FAMILIES, RANDOM
from tests.triton.triton_cases import EXTRA, TOLERANCE, as_list, compile_triton

from vfuse.runtime.triton import TritonExecutor
from vfuse.schedule import BufKind

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

CASES = {**FAMILIES, **EXTRA}


def _lean(compiled: Any) -> TritonExecutor:
    ex = compiled.compiled.executor
    assert isinstance(ex, TritonExecutor) and not ex._memory  # before the first call binds a device
    ex.lean_devices = ("cpu",)
    return ex


@pytest.mark.parametrize("family", sorted(set(CASES) - RANDOM))
def test_lean_calls_match_eager_where_the_program_qualifies(family: str) -> None:
    fn, inputs = CASES[family]
    compiled = compile_triton(fn, inputs)
    ex = _lean(compiled)
    first, second = as_list(compiled(*inputs)), as_list(compiled(*inputs))
    tol = TOLERANCE.get(family, 2e-5)
    for a, b, w in zip(first, second, as_list(fn(*inputs)), strict=True):
        assert a.dtype == w.dtype and a.shape == w.shape
        torch.testing.assert_close(a, w, rtol=tol, atol=tol, equal_nan=True)
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)
    buffers = ex.program.buffers
    qualifies = (
        ex.stats.torch_calls == 0
        and not ex.rendered.faults
        and all(o in buffers and buffers[o].kind is BufKind.OUTPUT for o in ex.graph.outputs)
    )
    assert ex._mem is not None and (ex._mem.lean is not None) == qualifies
    if qualifies:  # fresh outputs per call: the first call's results are not overwritten
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, second, strict=True) if a.numel())


def test_lean_static_outputs_reuse_one_buffer() -> None:
    fn, inputs = FAMILIES["layernorm_gelu"]
    compiled = compile_triton(fn, inputs, static_outputs=True)
    ex = _lean(compiled)
    a = compiled(*inputs)
    b = compiled(*(x * 2 for x in inputs))
    assert ex._mem is not None and ex._mem.lean is not None
    assert a.data_ptr() == b.data_ptr()
    torch.testing.assert_close(b, fn(*(x * 2 for x in inputs)), rtol=2e-5, atol=2e-5)


def test_lean_reads_views_and_permuted_inputs() -> None:
    fn = lambda x, y: (x.t() * 2 + y).relu()  # noqa: E731
    base = torch.randn(9, 14)
    x, y = base[:, 1:8], torch.randn(7, 9)  # a strided view: made contiguous for the kernel
    compiled = compile_triton(fn, (x, y))
    ex = _lean(compiled)
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert ex._mem is not None and ex._mem.lean is not None
