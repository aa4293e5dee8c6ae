"""Floats computed from symbolic sizes (Dynamo's SymFloats: the 2.0 / (N - 1) of a variance's
backward, mse_loss's 2.0 / numel) are computed per call from the sizes the kernels read: one
graph and one build for every size, no per-shape warning, eager's values forward and backward,
the cpp and interp backends alike. A SymFloat over a symbol no input gives stays a LoweringError."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._sympy.functions import FloatTrueDiv, ToFloat, TruncToFloat
from torch.utils._sympy.value_ranges import ValueRanges

import vfuse
import vfuse.compiler as compiler
from vfuse.context import Context, Options
from vfuse.frontend.errors import LoweringError
from vfuse.frontend.symbols import SymScalar, sym_env, sym_scalar
from vfuse.ir import DType, Op
from vfuse.ir.sym import SymEnv, is_sym
from vfuse.runtime.symbolic import SymbolicExecutor


def var_and_mse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Backward: FloatTrueDiv(2.0, ToFloat(s1) - 1.0) (var over dim 1), 2.0 / (s0*s1) (mse)."""
    return x.var(1, keepdim=True) * x + torch.nn.functional.mse_loss(x, y) + x.std()


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The call index of each native build (`calls[0]` is set by the test before each call)."""
    calls = [0]
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        calls.append(calls[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    return calls


def _train(fn: Callable, c: Callable, shape: tuple[int, int]) -> None:
    """One forward and backward of `c` against eager's `fn`, outputs and both gradients."""
    x, y = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
    xe, ye = (t.detach().clone().requires_grad_() for t in (x, y))
    weights = torch.randn(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a per-shape compilation says so
        got = c(x, y)
        (got * weights).sum().backward()
    want = fn(xe, ye)
    (want * weights).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.grad, ye.grad, rtol=1e-5, atol=1e-5)


def _sized_f64_fulls(backend: object) -> list[object]:
    return [
        n
        for g in backend.compiled  # type: ignore[attr-defined]
        for n in g.graph.nodes
        if n.op is Op.FULL and n.tensor_type.dtype is DType.F64 and is_sym(n.attrs["value"])
    ]


@pytest.mark.parametrize("kind", ["cpp", "interp"])
def test_size_scalars_of_a_backward_are_computed_per_call(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward and backward compile once (two builds, on the first call) and serve every later
    size; batch 1 (Dynamo specializes it: one more graph pair) then serves each length too."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    builds = _builds(monkeypatch)
    backend = vfuse.backend(strict=True, backend=kind, cache_dir=tmp_path)
    c = torch.compile(var_and_mse, backend=backend, dynamic=True)
    for i, shape in enumerate(((5, 7), (3, 11), (13, 2), (7, 3), (1, 13), (1, 5), (1, 17))):
        builds[0] = i
        _train(var_and_mse, c, shape)
    assert backend.stats["graphs"] == 4 and backend.stats["eager_graphs"] == 0
    assert all(isinstance(g.executor, SymbolicExecutor) for g in backend.compiled)
    assert builds[1:] == ([0, 0, 4, 4] if kind == "cpp" else [])
    assert _sized_f64_fulls(backend)  # the scalars read the sizes, in the backward graphs


def test_cpp_and_interp_agree_on_a_size_scalar() -> None:
    """The same symbolic graph through both backends: the f64 scalar is the same double."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 / (torch.sym_float(x.shape[0] * x.shape[1]) - 1.0))

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6, 5))
    xs = [torch.randn(7, 3), torch.randn(1, 13), torch.randn(11, 2)]
    got = {}
    for kind in ("cpp", "interp"):
        opts = Options(verify=True, raise_codegen_errors=True, backend=kind)
        cg = compiler.compile_fx(gm, Context(opts), symbols=sym_env(gm))
        assert isinstance(cg.executor, SymbolicExecutor)
        got[kind] = [cg(x)[0] for x in xs]
    for x, a, b in zip(xs, got["cpp"], got["interp"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, f(x), rtol=0, atol=0)


def _env() -> tuple[SymEnv, sympy.Symbol]:
    s = sympy.Symbol("s0", integer=True, positive=True)
    return SymEnv({s: (6, ValueRanges(2, sympy.oo))}), s


def test_a_size_scalar_as_a_value_is_specialized_and_unknown_ones_refused() -> None:
    """float(v) is the hint's value with the symbol guarded (never wrong at another size); a
    symbol no input gives (data-dependent) and an operation the IR lacks are LoweringErrors."""
    env, s = _env()
    v = sym_scalar(env, FloatTrueDiv(2.0, ToFloat(s) - 1.0))
    assert isinstance(v, SymScalar) and not env.guards
    assert float(v) == 2.0 / (6.0 - 1.0) and env.guards == [sympy.Eq(s, 6)]
    assert sym_scalar(env, FloatTrueDiv(2.0, ToFloat(sympy.Integer(4)))) == 0.5
    u = sympy.Symbol("u0", integer=True)
    with pytest.raises(LoweringError, match="data-dependent"):
        sym_scalar(env, FloatTrueDiv(1.0, ToFloat(u)))
    with pytest.raises(LoweringError, match="not supported"):
        sym_scalar(env, TruncToFloat(FloatTrueDiv(1.0, ToFloat(s))))
