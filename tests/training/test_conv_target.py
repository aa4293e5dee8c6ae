"""The conv data gradient's form is priced with the target the compiler resolved (`compiler.target_of`),
passed to the lowering once (`frontend.lower.lower(..., target=)`): a backward graph with several
convolution_backward nodes resolves the target once, not once more per node (~2 ms each)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.ir import Op
from vfuse.targets import cpu

aten = torch.ops.aten
# (in channels, out channels, plane, stride, padding, groups): strided, stride 1, grouped.
CONVS = [(5, 7, 11, 2, 1, 1), (7, 6, 9, 1, 1, 1), (6, 4, 7, 2, 0, 2)]


def _backward(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each conv's data, weight and bias gradients, as AOTAutograd's backward asks for them."""
    out = []
    for i, (_, cout, _, s, p, g) in enumerate(CONVS):
        go, x, w = args[3 * i : 3 * i + 3]
        gi, gw, gb = aten.convolution_backward(go, x, w, [cout], [s, s], [p, p], [1, 1], False, [0, 0], g, [True] * 3)
        out += [gi, gw, gb]
    return tuple(out)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    args = []
    for cin, cout, hw, s, p, g in CONVS:
        x, w = torch.randn(2, cin, hw, hw), torch.randn(cout, cin // g, 3, 3)
        go = torch.randn_like(torch.nn.functional.conv2d(x, w, None, s, p, 1, g))
        args += [go, x, w]
    return args


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the cpu target's resolutions (every `get_target("cpu")` goes through `cpu_target`)."""
    calls: list[int] = []
    real = cpu.cpu_target

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(cpu, "cpu_target", counted)
    return calls


def test_several_conv_backwards_resolve_the_target_once(tmp_path: Path, resolutions: list[int]) -> None:
    args = _inputs()
    gm = trace_aten(_backward, args)
    assert sum(n.target is aten.convolution_backward.default for n in gm.graph.nodes) == len(CONVS)
    ctx = Context(Options(cache_dir=tmp_path, strict=True, raise_codegen_errors=True, verify=True))
    compiled = compiler.compile_fx(gm, ctx)
    assert len(resolutions) == 1  # compile_fx's own; the lowering takes it (was 1 + one per data gradient)
    for got, want in zip(compiled(*args), _backward(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_lowering_without_a_target_resolves_it_once(resolutions: list[int]) -> None:
    """Callers that pass none (the report, tests) resolve ctx's target on first use, once."""
    gm = trace_aten(_backward, _inputs())
    ctx = Context()
    by_default = lower(gm, ctx)
    assert len(resolutions) == 1
    given = lower(gm, ctx, target=compiler.target_of(ctx))
    forms = [[n.attrs.get("form") for n in g.nodes if n.op in (Op.MATMUL, Op.CONV2D)] for g in (by_default, given)]
    assert forms[0] == forms[1] and any(f is not None for f in forms[0])
