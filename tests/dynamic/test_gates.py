"""schedule/gates.py: a choice over symbolic sizes is a bool where the symbols' ranges decide it
(no guard) and a SizeGate where they hold both sides; conjunctions and disjunctions of choices
keep every test; the C++ condition the renderer writes computes what the gate says. No g++."""

from __future__ import annotations

import sympy
from tests.dynamic.gates import holds
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.codegen.cpp.function import condition
from vfuse.ir.sym import SymEnv
from vfuse.schedule.gates import SizeGate, both, either, size_choice

R, C = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)


def _env(cols: ValueRanges) -> SymEnv:
    return SymEnv({R: (100, ValueRanges(2, sympy.oo)), C: (600, cols)})


def test_ranges_decide_without_a_guard_and_gates_keep_both_sides() -> None:
    env = _env(ValueRanges(512, 1024))
    n, d = env.size(R), env.size(C)
    assert size_choice(4 * d, 2048) is True and size_choice(d, 1025) is False
    gate = size_choice(n * d, 32768)
    assert isinstance(gate, SizeGate) and gate.limit == 32768 and gate.at_hint()
    assert size_choice(3, 2) is True and size_choice(1, 2) is False
    assert env.guards == []


def test_conjunction_and_disjunction_hold_where_their_parts_do() -> None:
    env = _env(ValueRanges(2, 4096))
    n, d = env.size(R), env.size(C)
    rows, wide = size_choice(n, 64), size_choice(d, 1000)
    assert isinstance(rows, SizeGate) and isinstance(wide, SizeGate)
    aligned = SizeGate(n * d, 0, aligned=(4 * d,))
    conj, disj = both(rows, wide), either(aligned, both(rows, wide))
    assert both(True, rows) is rows and both(rows, False) is False and either(rows, True) is True
    for r, c in [(2, 2), (64, 999), (64, 1000), (63, 1000), (5, 16), (5, 17), (100, 4000)]:
        at = {"s0": r, "s1": c}
        assert holds(conj, at) == (r >= 64 and c >= 1000)
        assert holds(disj, at) == ((4 * c) % 64 == 0 or (r >= 64 and c >= 1000))
    assert env.guards == []


def test_the_cpp_condition_is_the_gate() -> None:
    env = _env(ValueRanges(2, 4096))
    n, d = env.size(R), env.size(C)
    gate = either(SizeGate(n * d, 100, aligned=(4 * d,)), SizeGate(n, 64, (SizeGate(d, 1000),)))
    text = condition(gate)
    assert text == (
        "((int64_t)((vf_s0*vf_s1)) >= (int64_t)100LL && (int64_t)((4*vf_s1)) % 64 == 0)"
        " || ((int64_t)(vf_s0) >= (int64_t)64LL && (int64_t)(vf_s1) >= (int64_t)1000LL)"
    )
    for r, c in [(2, 2), (10, 10), (3, 16), (64, 1000), (64, 999)]:
        py = text.replace("(int64_t)", "").replace("LL", "").replace("&&", "and").replace("||", "or")
        assert eval(py.replace("vf_s0", str(r)).replace("vf_s1", str(c))) == holds(gate, {"s0": r, "s1": c})
