"""Conv training under torch.compile(dynamic=True) compiles once for every batch size: the weight
gradient's folded GEMM (codegen/cpp/gemm/conv_wgrad.py) reads the batch (its K) and the planes at
run time, a grouped one as one GEMM per group, and BatchNorm's running-variance factor n / (n - 1)
is f64 arithmetic over the sizes (no specialization on the count). Gradients and running statistics
are eager's at every size; no per-shape warning (a warning fails the test)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from tests.training.conv_steps import ConvBnRelu, check_step, init_bn

import vfuse
import vfuse.compiler as compiler
from vfuse.ir import Op
from vfuse.ir.sym import is_sym
from vfuse.runtime.symbolic import SymbolicExecutor
from vfuse.schedule.kernel import ContractionKernel

# (in channels, out channels, kernel, stride, padding, groups, batches, graphs), every conv padded:
# stride 1, stride 2, grouped stride 2. Batches: a first size, 1 (Dynamo specializes it: one more
# forward and backward, each built once; the weight gradient's batch constant, its planes
# symbolic), a prime, and the first size again. Dynamo's first graph of a grouped conv is static in
# the batch (one more forward and backward; the 1 there is the grouped folded GEMM over symbolic
# planes). Stride 2 skips the 1 (its constant-batch graph is stride 1's with other phases: 2
# graphs, ~16 s cold).
CASES = [
    (3, 8, 3, 1, 1, 1, (4, 1, 7, 4), 4),
    (3, 8, 3, 2, 1, 1, (4, 13, 4), 2),
    (4, 8, 3, 2, 1, 2, (4, 1, 7, 4), 6),
]


@pytest.mark.parametrize("case", CASES, ids=["stride1", "stride2", "grouped"])
def test_conv_training_compiles_once_over_batch_sizes(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    cin, cout, k, stride, pad, groups, batches, graphs = case
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = ConvBnRelu(cin, cout, k, stride, pad, groups)
    init_bn(eager)
    model = copy.deepcopy(eager)
    builds: list[int] = []
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        builds.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    # No kept program (it would skip `build`); the kernel cache is the shared one: `build` still
    # runs for every graph, a warm run only skips g++.
    monkeypatch.setenv("VFUSE_GRAPH_CACHE", "0")
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a per-shape compilation says so
        for n in batches:
            check_step(eager, model, compiled, torch.randn(n, cin, 11, 11))
    assert backend.stats["graphs"] == graphs and len(builds) == graphs  # each graph built once
    folded = [
        kern
        for g in backend.compiled
        if isinstance(g.executor, SymbolicExecutor)
        for kern in g.executor.program.kernels
        if isinstance(kern, ContractionKernel) and kern.op is Op.CONV2D and kern.attrs.get("folded")
    ]
    # The weight gradient: the batch is the folded conv's input channels (its K), a symbol (the
    # graph Dynamo specialized on batch 1 has it constant, its planes symbolic).
    assert any(is_sym(kern.shapes[0][1]) for kern in folded)
    assert all(kern.attrs["groups"] == groups for kern in folded)
    torch._dynamo.reset()
