"""A CAT along the SIMD loop's dim split into one range per piece (schedule/peel.py `ranges`):
each range reads its own input only, with no per-element select or clamp, and in blocks where a
piece is read through a head permute (div / mod of the loop var hoisted per block:
`expr.within`). Numerics against eager at odd widths (primes, 1), through views and permutes,
in the forward and in the backward (the gradient of a split is a CAT)."""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch

import vfuse
from vfuse.schedule.expr import Clamp, Div, Lin, Mod, Var, within
from vfuse.schedule.kernel import Kernel, Range

V, W, B = Var(2), Var(1), Var(9)


def _value(e: Lin, env: dict[int, int]) -> int:
    """`e` evaluated as the C++ renders it (truncating division)."""
    out = e.const
    for a, c in e.terms:
        if isinstance(a, Var):
            x = env[a.id]
        elif isinstance(a, Div | Mod):
            n = _value(a.arg, env)
            q = abs(n) // a.divisor * (1 if n >= 0 else -1)
            x = q if isinstance(a, Div) else n - q * a.divisor
        else:
            assert isinstance(a, Clamp)
            x = min(max(_value(a.arg, env), a.lo), a.hi)
        out += c * x
    return out


def _forms() -> list[Lin]:
    v, w = Lin.var(V), Lin.var(W)
    div = lambda e, d: Lin(0, ((Div(e, d), 1),))  # noqa: E731
    mod = lambda e, d: Lin(0, ((Mod(e, d), 1),))  # noqa: E731
    clamp = lambda e, lo, hi: Lin(0, ((Clamp(e, lo, hi), 1),))  # noqa: E731
    return [
        div(clamp(v - 24, 0, 23), 8) * 100 + mod(clamp(v - 24, 0, 23), 8) + w * 7,  # a head-permuted piece
        div(v - 3, 8) * 5 + mod(v - 3, 8),  # misaligned: the range's start is not a block start
        div(v + w * 16, 16) + mod(v + w * 16, 16) * 3,  # another loop's multiple inside
        div(v + w * 3, 8) + mod(v, 4),  # neither blockable by 8: left as is
        clamp(v * 2 - 5, 0, 40) + mod(v - 1, 16),  # a strided clamp active at one end
    ]


@pytest.mark.parametrize("lo, hi, block", [(24, 48, 8), (0, 48, 8), (3, 35, 8), (16, 48, 16), (24, 48, 0), (5, 6, 0)])
def test_within_equals_the_form_everywhere_in_the_range(lo: int, hi: int, block: int) -> None:
    """Whatever range and block it is asked for, `within` rewrites only what holds there."""
    for e in _forms():
        for x, w in itertools.product(range(lo, hi), range(3)):
            base = lo + (x - lo) // block * block if block else 0
            got = within(e, V.id, lo, hi, block, B.id)
            assert _value(got, {V.id: x, W.id: w, B.id: base}) == _value(e, {V.id: x, W.id: w}), (e, got, x, w)


def test_within_hoists_a_head_permuted_piece_per_block() -> None:
    e = _forms()[0]
    got = within(e, V.id, 24, 48, 8, B.id)
    # no div, mod or clamp of the SIMD var is left: the load is contiguous within a block
    assert all(V.id not in {a.id for a, _ in lin.terms if isinstance(a, Var)} for lin in _nested(got)), got
    assert got.coef(V) == 1


def _nested(e: Lin) -> list[Lin]:
    return [a.arg for a, _ in e.terms if isinstance(a, Div | Mod | Clamp)]


def _heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, t, h * d)


CASES = {
    # name: (function, shapes of its inputs)
    "3 head-permuted pieces (GPT-2's dq, dk, dv)": (
        lambda a, b, c: torch.cat([_heads(a), _heads(b), _heads(c)], dim=2) * 2.0,
        [(2, 4, 13, 8), (2, 4, 13, 8), (2, 4, 13, 8)],
    ),
    "4 pieces, prime widths and 1": (
        lambda a, b, c, d: torch.cat([a, b, c, d], dim=-1) + 1.0,
        [(5, 7), (5, 1), (5, 13), (5, 3)],
    ),
    "3 pieces of a transposed and a sliced input": (
        lambda a, b, c: torch.relu(torch.cat([a.t(), b[:, 2:9], c], dim=1)),
        [(11, 3), (3, 17), (3, 5)],
    ),
    "pieces read at an offset of the output: cat, then a slice": (
        lambda a, b, c: torch.cat([a, b, c], dim=-1)[..., 3:20] - 0.5,
        [(2, 3, 9), (2, 3, 1), (2, 3, 11)],
    ),
    "heads of 16 and of 3 floats": (
        lambda a, b, c: torch.cat([_heads(a), _heads(b), _heads(c)], dim=2).sigmoid(),
        [(1, 2, 5, 16), (1, 3, 5, 3), (1, 1, 5, 16)],
    ),
}


def _kernels(g: object) -> list[Kernel]:
    return [k for k in g.compiled.executor.program.kernels if isinstance(k, Kernel)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(CASES))
def test_cat_ranges_match_eager(name: str) -> None:
    fn, shapes = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    xs = tuple(torch.randn(s, generator=gen) for s in shapes)
    g = vfuse.compile(fn, xs)
    torch.testing.assert_close(g(*xs), fn(*xs), rtol=1e-6, atol=1e-6)
    ranged = [p.ranges for k in _kernels(g) for p in k.passes if p.ranges]
    assert ranged, "the CAT's SIMD loop was not split into ranges"
    for rs in ranged:  # the ranges tile the loop
        assert all(a.hi == b.lo for a, b in itertools.pairwise(rs)) and rs[0].lo == 0


def _function(source: str, name: str) -> str:
    start = source.index(f"static void {name}(")
    return source[start : source.index("\n}\n", start)]


def test_ranged_copy_has_no_per_element_select_or_clamp() -> None:
    """GPT-2's dq/dk/dv layout: each range is a plain copy of one input, in blocks of a head."""
    fn, shapes = CASES["3 head-permuted pieces (GPT-2's dq, dk, dv)"]
    xs = tuple(torch.randn(s) for s in shapes)
    g = vfuse.compile(fn, xs)
    (k,) = [k for k in _kernels(g) if any(p.ranges for p in k.passes)]
    (p,) = k.passes
    assert [(r.lo, r.hi, r.block) for r in p.ranges] == [(0, 32, 8), (32, 64, 8), (64, 96, 8)]
    assert [tuple(dict(r.picks).values()) for r in p.ranges] == [(0,), (1,), (2,)]
    assert all(len(r.dead) == 2 for r in p.ranges)  # the other two pieces' loads
    body = _function(g.compiled.executor.source, k.name)
    assert "?" not in body and "vf_clamp_i" not in body, body  # no select, no clamp
    simd = re.findall(r"#pragma omp simd\n\s*for \(int64_t (\w+) = (\w+); \1 < \2 \+ 8;", body)
    assert len(simd) == 3, body
    loads = re.findall(r"const float \w+ = p_\w+\[([^\]]*)\];", body)
    assert len(loads) == 3, body
    for idx in loads:  # the SIMD var appears alone (contiguous): div / mod only of the block's start
        assert not re.search(rf"\([^()]*\b{simd[0][0]}\b[^()]*\) [/%]", idx), idx


def test_cat_of_split_gradients_matches_eager_in_the_backward() -> None:
    """A fused qkv projection split along the last dim and read per head: its backward
    concatenates dq, dk, dv along the last dim (the ranges), compared with eager's gradients."""

    class Qkv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(24, 3 * 24)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (y.view(b, t, 3, 8).transpose(1, 2) for y in self.proj(x).split(24, dim=2))
            return (q * 2 + k.sin() + v * v).sum(dim=(1, 3))

    torch.manual_seed(0)
    model, x = Qkv(), torch.randn(2, 7, 24)
    ref = Qkv()
    ref.load_state_dict(model.state_dict())
    backend = vfuse.backend(strict=True)
    torch.compile(model, backend=backend)(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-4)  # sums in another order
    programs = [g.executor.program for g in backend.compiled]
    assert any(p.ranges for prog in programs for k in prog.kernels if isinstance(k, Kernel) for p in k.passes)


def test_random_cats_match_eager() -> None:
    """Random piece counts and widths (1 to 13) along the last dim of a permuted input."""
    rng = random.Random(7)
    for _ in range(4):
        widths = [rng.choice([1, 2, 3, 5, 7, 8, 11, 13]) for _ in range(rng.randint(3, 5))]
        xs = tuple(torch.randn(3, w, 2).transpose(1, 2) for w in widths)
        fn = lambda *a: torch.cat(a, dim=-1) * 3.0  # noqa: E731
        g = vfuse.compile(fn, xs)
        torch.testing.assert_close(g(*xs), fn(*xs), rtol=1e-6, atol=1e-6)
        assert any(p.ranges for k in _kernels(g) for p in k.passes), widths


def test_range_type_is_schedule_data() -> None:
    r = Range(0, 8, (("t1", 0),), ("t2",), 8, 5)
    assert r.block == 8 and dict(r.picks) == {"t1": 0}
