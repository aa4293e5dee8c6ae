"""Convs over symbolic planes (torch.compile(dynamic=True) of a module: its weight's sizes are
constants, the input's batch and planes symbols) compile once: the implicit GEMM (the driver
blocks at run time, the gather reads the sizes), not the direct path laid out for constant
planes. Every later size runs the same build, eager's values; no per-shape warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import vfuse
import vfuse.compiler as compiler
from vfuse.ir import Op
from vfuse.ir.sym import is_sym
from vfuse.runtime.symbolic import SymbolicExecutor
from vfuse.schedule.kernel import ContractionKernel

# (stride, groups, kernel, padding, dilation): the grouped strided conv of issue 15, a stride-1
# padded one (the direct path at fixed sizes), a dilated strided one, a grouped 1x1.
GEOMETRIES = [(2, 2, (3, 2), 0, 1), (1, 1, (3, 3), 1, 1), (2, 1, (3, 3), 1, 2), (1, 2, (1, 1), 0, 1)]
# Odd planes, primes; batch 1 last (Dynamo specializes it: one more graph, built once).
SHAPES = [(2, 7, 9), (3, 11, 13), (5, 13, 17), (2, 23, 10), (1, 9, 11), (1, 19, 14), (1, 5, 7)]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv_over_symbolic_planes_compiles_once(
    geometry: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stride, groups, kernel, padding, dilation = geometry
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, kernel, stride=stride, groups=groups, padding=padding, dilation=dilation)
    m = torch.nn.Sequential(conv, torch.nn.GroupNorm(2, 6), torch.nn.ReLU())
    builds, call = [], [0]
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        builds.append(call[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    backend = vfuse.backend(strict=True, cache_dir=tmp_path)
    c = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a per-shape compilation says so
        for i, (n, h, w) in enumerate(SHAPES):
            call[0] = i
            x = torch.randn(n, 4, h, w)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    assert builds == [0, 4] and backend.stats["graphs"] == 2
    assert all(isinstance(g.executor, SymbolicExecutor) for g in backend.compiled)
    convs = [
        k
        for g in backend.compiled
        for k in g.executor.program.kernels
        if isinstance(k, ContractionKernel) and k.op is Op.CONV2D
    ]
    assert convs and all(is_sym(k.out_shape[2]) and is_sym(k.out_shape[3]) for k in convs)
    assert not any(k.conv_blocks.direct for k in convs)
