"""Conv training under torch.compile(dynamic=True) compiles once for every batch size: the weight
gradient's folded GEMM (codegen/cpp/gemm/conv_wgrad.py) reads the batch (its K) and the planes at
run time, a grouped one as one GEMM per group, and BatchNorm's running-variance factor n / (n - 1)
is f64 arithmetic over the sizes (no specialization on the count). Gradients and running statistics
are eager's at every size; no per-shape warning (a warning fails the test)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from tests.training.conv_steps import ConvBnRelu

import vfuse
import vfuse.compiler as compiler
from vfuse.ir import Op
from vfuse.ir.sym import is_sym
from vfuse.runtime.symbolic import SymbolicExecutor
from vfuse.schedule.kernel import ContractionKernel

# Batch sizes: 1 (Dynamo specializes it: one more forward and backward, each built once) and primes.
BATCHES = (4, 6, 1, 7, 13)


def _step(eager: torch.nn.Module, model: torch.nn.Module, compiled, x: torch.Tensor) -> None:
    """One forward and backward of both; the input's and every parameter's gradient, the output and
    the running statistics against eager's."""
    xe, xv = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(xe), compiled(xv)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    grad_out = torch.randn_like(want)
    want.backward(grad_out)
    got.backward(grad_out)
    grads = [(xv.grad, xe.grad)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]
    scale = max(w.abs().max().item() for _, w in grads)  # the conv bias's gradient is 0 up to rounding
    for g, w in grads:
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * scale)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(eager.bn, name))


# (in channels, out channels, kernel, stride, padding, groups, graphs): stride 1 padded, strided, grouped
# strided (Dynamo's first graph of a grouped conv is static in the batch: one more forward and backward).
CASES = [(3, 8, 3, 1, 1, 1, 4), (3, 8, 3, 2, 1, 1, 4), (4, 8, 3, 2, 1, 2, 6)]


@pytest.mark.parametrize("case", CASES, ids=["stride1", "stride2", "grouped"])
def test_conv_training_compiles_once_over_batch_sizes(
    case: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cin, cout, k, stride, pad, groups, graphs = case
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = ConvBnRelu(cin, cout, k, stride, pad, groups)
    with torch.no_grad():
        eager.bn.weight.uniform_(0.5, 1.5)
        eager.bn.bias.uniform_(-0.5, 0.5)
    model = copy.deepcopy(eager)
    builds: list[int] = []
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        builds.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    monkeypatch.setenv("VFUSE_GRAPH_CACHE", "0")
    backend = vfuse.backend(strict=True, cache_dir=tmp_path)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a per-shape compilation says so
        for n in BATCHES:
            _step(eager, model, compiled, torch.randn(n, cin, 11, 11))
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
