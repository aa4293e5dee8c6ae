"""A strided conv's col2im (frontend/conv_dgrad_gemm.py's phase interleave) walked by the
schedule's residue split (schedule/residue.py): v = s * q + b, b unrolled, q the SIMD loop.
Numerics against eager at odd shapes (strides 2 and 3, widths the stride does not divide so the
tail runs, padding, dilation, batch 1, primes, groups, dynamic shapes) and the split's structure."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.schedule.expr import Div, Lin, Mod, Var, substitute
from vfuse.schedule.kernel import Kernel, TorchStep

aten = torch.ops.aten

# (N, Cin, H, W, Cout, kernel, stride, padding, dilation)
CASES = [
    (8, 32, 28, 28, 64, 3, 2, 1, 1),  # the step the split was made for
    (1, 3, 11, 7, 13, 3, 2, 0, 1),  # batch 1, widths the stride does not divide: a tail
    (2, 5, 13, 13, 7, 3, 3, 1, 1),  # stride 3, 13 = 3 * 4 + 1
    (1, 7, 9, 17, 2, 2, 2, 0, 1),  # 2x2 s2: no overlap, every phase one tap
    (2, 3, 10, 11, 5, 3, 2, 2, 2),  # dilation 2, padding past the taps' reach
    (1, 2, 5, 1, 3, 3, 2, 1, 1),  # width 1: nothing to split, the loop is the tail
    (3, 11, 12, 12, 2, (3, 2), (2, 3), (1, 0), 1),  # mixed strides: 3 phases along the width
]


def _pair(v: int | tuple[int, int]) -> list[int]:
    return list(v) if isinstance(v, tuple) else [v, v]


def _grad_input(stride: list[int], pad: list[int], dil: list[int], groups: int = 1):
    def fn(go: torch.Tensor, x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        mask = [True, False, False]
        return aten.convolution_backward(go, x, wt, None, stride, pad, dil, False, [0, 0], groups, mask)[0]

    return fn


def _inputs(case: tuple, groups: int = 1) -> tuple[torch.Tensor, ...]:
    n, c, h, w, co, k, s, p, d = case
    x = torch.randn(n, c, h, w)
    wt = torch.randn(co, c // groups, *_pair(k))
    go = torch.randn_like(F.conv2d(x, wt, None, _pair(s), _pair(p), _pair(d), groups))
    return go, x, wt


def _kernels(compiled: object) -> list[Kernel]:
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    return [k for st in program.steps if not isinstance(st, TorchStep) for k in st.kernels if isinstance(k, Kernel)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_s{c[6]}")
def test_data_gradient_matches_eager(case: tuple) -> None:
    torch.manual_seed(0)
    fn = _grad_input(_pair(case[6]), _pair(case[7]), _pair(case[8]))
    go, x, wt = _inputs(case)
    compiled = vfuse.compile(fn, (go, x, wt), strict=True)
    want = fn(go, x, wt)
    torch.testing.assert_close(compiled(go, x, wt), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_col2im_is_split_by_phase() -> None:
    """The 3x3 s2 col2im kernel's SIMD loop is split in two copies and its row loop in two
    branches: the schedule says so, and the rendered kernel has no `% 2` or `/ 2` of the column
    (its loads are not gathers, its phase selects are gone) nor a select on the row's phase."""
    torch.manual_seed(0)
    fn = _grad_input([2, 2], [1, 1], [1, 1])
    go, x, wt = _inputs(CASES[0])
    compiled = vfuse.compile(fn, (go, x, wt), strict=True)
    (kernel,) = [k for k in _kernels(compiled) if any(p.residue for p in k.passes)]
    (split,) = [p.residue for p in kernel.passes]
    assert (split.stride, split.groups, split.row_stride, len(split.bodies)) == (2, 14, 2, 4)
    col, row = (f"i{split.var}", f"i{split.row}")
    source = compiled.compiled.executor.source
    text = source[source.index(f"static void {kernel.name}(") :]
    text = text[: text.index("\n}\n")]
    assert f"for (int64_t {col}q = 0;" in text and f"for (int64_t {col} = " not in text  # 28 = 2 * 14: no tail
    for var in (col, row):
        assert f"({var}) % 2" not in text and f"({var}) / 2" not in text, text
    assert f"{row} % 2 == 1" in text and f"2 * {col}q + 56 * {row}r + 29]" in text  # odd row, odd column


def test_stride_3_and_tail_split() -> None:
    """Stride 3 over 13 columns and rows: three copies over q < 4 in each of three row phases,
    the last column a tail."""
    torch.manual_seed(0)
    case = CASES[2]
    fn = _grad_input([3, 3], [1, 1], [1, 1])
    go, x, wt = _inputs(case)
    compiled = vfuse.compile(fn, (go, x, wt), strict=True)
    split = [p.residue for k in _kernels(compiled) for p in k.passes if p.residue is not None]
    assert [(r.stride, r.groups, r.row_stride, len(r.bodies)) for r in split] == [(3, 4, 3, 9)]
    want = fn(go, x, wt)
    torch.testing.assert_close(compiled(go, x, wt), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_substitute_folds_div_and_mod() -> None:
    """v = 2q + b: (v + 1) // 2 is q + (b + 1) // 2 and v % 2 is b for both b; a divisor the
    stride does not fold (v // 3 with v = 2q + b) is left a div of q."""
    v, q = Var(0), Var(1)
    sizes = {0: 28, 1: 14}
    for b in (0, 1):
        form = Lin.var(q) * 2 + b
        assert substitute(Lin(0, ((Div(Lin.var(v) + 1, 2), 1),)), 0, form, sizes) == Lin.var(q) + (b + 1) // 2
        assert substitute(Lin(0, ((Mod(Lin.var(v), 2), 1),)), 0, form, sizes) == Lin.of(b)
        left = substitute(Lin(0, ((Div(Lin.var(v), 3), 1),)), 0, form, sizes)
        assert any(isinstance(a, Div) for a, _ in left.terms)
    plain = Lin.var(Var(2)) * 5 + 3
    assert substitute(plain, 0, Lin.var(q) * 2, sizes) is plain  # no v: the same form


class _Conv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, pad: int, groups: int = 1, dil: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=pad, groups=groups, dilation=dil)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x))


def _step_grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    xg = x.clone().requires_grad_()
    out = model(xg)
    out.backward(torch.ones_like(out) * 0.5)
    return [xg.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize(
    ("shape", "conv", "dynamic"),
    [
        ((1, 4, 9, 13), (4, 6, 3, 2, 1, 2), False),  # groups 2, odd sizes
        ((2, 3, 11, 11), (3, 5, 3, 3, 1, 1), False),  # stride 3
        ((2, 3, 12, 15), (3, 5, 3, 2, 1, 1), True),  # dynamic shapes, then other sizes
    ],
)
def test_training_step_matches_eager(shape: tuple[int, ...], conv: tuple[int, ...], dynamic: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _Conv(*conv)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend=vfuse.backend(strict=True), dynamic=dynamic)
    shapes = [shape, (shape[0] + 1, shape[1], shape[2] + 2, shape[3] + 1)] if dynamic else [shape]
    for sh in shapes:
        eager.zero_grad()
        model.zero_grad()
        x = torch.randn(*sh)
        for got, want in zip(_step_grads(compiled, x), _step_grads(eager, x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
