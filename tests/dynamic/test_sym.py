"""Symbolic sizes (ir/sym.py): arithmetic, proofs over the ranges, guards at the hint,
specialization when a plain int is read, printing; guard functions and substitution."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.ir import DType, TensorType
from vfuse.ir.shapes import ShapeError, broadcast, matmul
from vfuse.ir.sym import SymEnv, SymSize, cpp, hint, known_multiple, pretty, python
from vfuse.runtime.symbolic import Substitution, concretize, guard_function

S0, S1 = sympy.symbols("s0 s1", integer=True, positive=True)


def _env(h0: int = 12, h1: int = 5) -> SymEnv:
    return SymEnv({S0: (h0, ValueRanges(2, sympy.oo)), S1: (h1, ValueRanges(2, sympy.oo))})


def test_arithmetic_stays_symbolic_and_folds_constants() -> None:
    env = _env()
    a, b = env.size(S0), env.size(S1)
    assert isinstance(a * 768, SymSize) and (a * 768).hint == 12 * 768
    assert (a * 16) // 16 == a  # FloorDiv folds: the same expression, no guard
    assert (a * b - a * b) == 0 and isinstance(a * b - a * b, int)
    assert ((a + 3) % 1) == 0
    assert hint((a, 7, b * 2)) == (12, 7, 10)
    assert env.guards == []


def test_relations_are_proved_over_the_ranges_without_guards() -> None:
    env = _env()
    a, b = env.size(S0), env.size(S1)
    assert a != 1 and a * 768 != 1 and a >= 2 and a * b > a  # s0 >= 2, s1 >= 2
    assert not (a == 0) and bool(a)
    assert env.guards == []


def test_an_undecidable_relation_is_answered_at_the_hint_and_guarded() -> None:
    env = _env(h0=12)
    a = env.size(S0)
    assert a < 100 and not (a < 10)
    assert env.guards == [S0 < 100, sympy.Not(S0 < 10)]
    fn = guard_function(env, ["s0", "s1"])
    assert fn(12, 5) and fn(50, 2) and not fn(100, 5) and not fn(9, 5)


def test_reading_a_plain_int_specializes() -> None:
    env = _env(h0=12)
    a = env.size(S0)
    assert list(range(a)) == list(range(12))  # __index__
    assert int(a * 2) == 24 and float(a) == 12.0 and f"{a:>4}" == "  12"
    assert sympy.Eq(S0, 12) in env.guards and sympy.Eq(2 * S0, 24) in env.guards
    assert not guard_function(env, ["s0", "s1"])(13, 5)


def test_decisions_after_compilation_raise() -> None:
    env = _env()
    env.frozen = True
    with pytest.raises(RuntimeError, match="after compilation"):
        _ = env.size(S0) < 7


def test_printing_cpp_and_python() -> None:
    env = _env()
    a, b = env.size(S0), env.size(S1)
    e = (a * b + 5) // 4
    assert f"{a * 768}" == "(768*vf_s0)"
    assert "vf_floordiv(" in f"{e}" and "vf_s1" in f"{e}"
    assert pretty(a * 768) == "768*s0" and str(a * 768) == "(768*vf_s0)"
    fn = eval(f"lambda s0, s1: {python(((a * b + 5) // 4 - a % 3).expr)}")
    assert fn(7, 3) == (7 * 3 + 5) // 4 - 7 % 3
    assert cpp(sympy.Integer(2**40)) == f"{2**40}LL"


def test_known_multiple_takes_no_guard() -> None:
    env = _env()
    a = env.size(S0)
    assert known_multiple(a * 16, 4) and not known_multiple(a, 4) and known_multiple(32, 8)
    assert env.guards == []


def test_a_relation_over_a_division_is_unproved_not_an_error() -> None:
    """torch's interval maths raises on a negative power whose base may be negative (a strided
    conv's output rows, (s1 - s0)//2 + 1, dividing a size: found by the warm fuzz): the relation
    is unproved, no guard, and never an exception out of the proof."""
    env = _env()
    rows = sympy.floor((S1 - S0) / 2) + 1
    cond = sympy.Eq(sympy.Mod(sympy.Mod(1, S0) / rows, 7), 0)
    assert env._prove(cond) is None and env.guards == []


def test_a_multiple_through_a_quotient_is_answered_at_once() -> None:
    """sympy's Mod divides out a common factor it cannot prove nonzero, leaving quotients inside the
    Mod; expanding or factoring that ran for hours (a dynamic fuzz program: a GEMM epilogue over a
    strided slice, unflattened). Unproved, no guard, in well under a second."""
    s40, s50 = sympy.symbols("s40 s50", integer=True, positive=True)
    env = SymEnv({s40: (11, ValueRanges(6, sympy.oo)), s50: (3, ValueRanges(2, 7))})
    rows = 9 - 2 * FloorDiv(9 - s50, 2)  # x[..., s50 - 9::2]-like extents
    x, m = env.size(s50 * rows), env.size(rows * (s40 - 2 * FloorDiv(s40 - s50, 2)))
    start = time.monotonic()
    assert not known_multiple(x, m) and env.guards == []
    assert time.monotonic() - start < 5


def test_shape_rules_over_symbolic_sizes() -> None:
    env = _env()
    a, b = env.size(S0), env.size(S1)
    assert broadcast((a, 1, 64), (b, 64)) == (a, b, 64)
    assert matmul((a, b, 64), (64, 32)) == (a, b, 32)
    t = TensorType((a, 64), DType.F32)
    assert t.nbytes == a * 256 and str(t) == "f32[s0,64]"
    assert env.guards == []
    with pytest.raises(ShapeError):
        broadcast((a, 3), (b, 4))
    assert env.guards == [sympy.Ne(S1, S0)]  # the message holds only where s0 != s1


@dataclass(frozen=True)
class _Box:
    shape: tuple
    items: dict
    name: str = "x"


def test_concretize_substitutes_everywhere_and_shares_what_has_no_size() -> None:
    env = _env()
    a = env.size(S0)
    static = (1, 2, 3)
    box = _Box((a, a * 4), {"k": [a + 1, "v"], "s": static})
    out = concretize(box, {S0: 9, S1: 2})
    assert out == _Box((9, 36), {"k": [10, "v"], "s": static}) and out.items["s"] is static
    assert concretize(static, {S0: 1}) is static


def test_substitution_walks_once_and_rebuilds_only_what_has_a_size() -> None:
    """One compiled substitution at many sizes: each call fresh values (shared subobjects,
    dict keys, types, floor division), the parts without a size shared; no guard taken."""
    env = _env()
    a, b = env.size(S0), env.size(S1)
    t = TensorType((a, (b + 1) // 2, 3), DType.F32)
    static = TensorType((4, 5), DType.F32)
    box = _Box((t, t), {a * 2: t, "s": static})
    sub = Substitution(box, symbols=env.symbols)
    for v0, v1 in ((2, 2), (9, 7), (1000, 3), (9, 7)):
        out = sub((v0, v1))
        want = TensorType((v0, (v1 + 1) // 2, 3), DType.F32)
        assert out.shape == (want, want) and out.items == {v0 * 2: want, "s": static}
        assert out.items["s"] is static and all(type(d) is int for d in out.shape[0].shape)
    assert Substitution(static)(()) is static
    assert env.guards == []


def test_smax_and_proved_take_no_guard() -> None:
    from vfuse.ir.sym import proved, smax

    env = _env(h0=12, h1=5)
    a, b = env.size(S0), env.size(S1)
    assert smax(a * 2, a) == a * 2 and smax(3, a * b) == a * b  # proved (s >= 2)
    m = smax(a, b)
    assert isinstance(m, SymSize) and m.hint == 12 and f"{m}" == "std::max<int64_t>(vf_s0, vf_s1)"
    assert proved(a, "<=", a * b) and not proved(a, "<", b) and not proved(b, "<", a)
    assert env.guards == []
