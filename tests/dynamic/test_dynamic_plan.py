"""Planning over symbolic sizes takes no guard where a structural "no" is safe: two
reductions over different symbols are different reductions (no fusion, no `s0 != s2`)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse.compiler as compiler
from vfuse.context import Context, Options
from vfuse.frontend.symbols import sym_env


def test_reductions_over_different_symbols_take_no_guard() -> None:
    def f(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.sum(1)  # rows of (s0, s1)
        return (z * a).sum(1), x.amax(1)  # rows of (s2, s0): another reduction's shape

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6, 9), torch.randn(5, 6))
    env = sym_env(gm)
    env.trace = {}
    cg = compiler.compile_fx(gm, Context(Options(verify=True, raise_codegen_errors=True)), symbols=env)
    assert env.guards == [], env.trace  # the summary compared (s0, s1) with (s2, s0) by value: s0 != s2
    for xs, zs in (((6, 9), (5, 6)), ((11, 3), (11, 11)), ((2, 1), (13, 2))):
        x, z = torch.randn(*xs), torch.randn(*zs)
        for got, want in zip(cg(x, z), f(x, z), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
