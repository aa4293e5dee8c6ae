"""schedule/memory.plan_memory over symbolic sizes: offsets past buffers whose ends no proof orders
are Max expressions, capped at MAX_OFFSET_OPS operations (past it a buffer goes after all placed so
far). Uncapped, a dynamic fuzz program's offsets nested into a 2400-node Max that sympy took a
minute to bound, per proof; here a plan of such buffers is made at once and never overlaps."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.ir.sym import SymEnv, is_sym
from vfuse.schedule import memory

S = sympy.symbols("s0 s1 s2", integer=True, positive=True)


def _sizes(env: SymEnv, n: int) -> list[object]:
    """Byte sizes no proof orders against each other: products and halves of three symbols."""
    s0, s1, s2 = S
    forms = [
        s0 * 36,
        s1 * 52,
        s2 * 4 * (FloorDiv(9 - s0, 2) + 1),
        s0 * s1 * 4,
        s1 * s2 * 8,
        (FloorDiv(s2 - s0, 2) + 1) * 12,
    ]
    return [env.size(forms[i % len(forms)] * (i // len(forms) + 1)) for i in range(n)]


def test_symbolic_offsets_stay_small_and_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    env = SymEnv(
        {S[0]: (3, ValueRanges(2, 7)), S[1]: (11, ValueRanges(6, sympy.oo)), S[2]: (9, ValueRanges(9, sympy.oo))}
    )
    n = 36
    sizes = _sizes(env, n)
    names = [f"v{i}" for i in range(n)]
    # Overlapping lifetimes: each value lives 6 steps, a new one born every step.
    live = {v: (i, i + 6) for i, v in enumerate(names)}
    graph = {v: SimpleNamespace(tensor_type=SimpleNamespace(nbytes=s)) for v, s in zip(names, sizes, strict=True)}
    monkeypatch.setattr(memory, "liveness", lambda graph, steps, values: live)
    start = time.monotonic()
    plan = memory.plan_memory(graph, [], set(names))  # type: ignore[arg-type]
    assert time.monotonic() - start < 60
    assert env.guards == []
    ops = [sympy.count_ops(o.expr) for o in plan.offsets.values() if is_sym(o)]
    assert max(ops) <= 4 * memory.MAX_OFFSET_OPS  # a capped Max, or the sum of the sizes placed
    for values in ({S[0]: 2, S[1]: 6, S[2]: 9}, {S[0]: 7, S[1]: 40, S[2]: 9}, {S[0]: 5, S[1]: 6, S[2]: 301}):
        at = {v: int(sympy.sympify(getattr(plan.offsets[v], "expr", plan.offsets[v])).subs(values)) for v in names}
        size = {v: int(sympy.sympify(getattr(s, "expr", s)).subs(values)) for v, s in zip(names, sizes, strict=True)}
        total = int(sympy.sympify(getattr(plan.size, "expr", plan.size)).subs(values))
        for a, b in itertools.combinations(names, 2):
            if live[a][0] <= live[b][1] and live[b][0] <= live[a][1]:
                assert at[a] + size[a] <= at[b] or at[b] + size[b] <= at[a], (a, b, values)
        assert all(0 <= at[v] and at[v] + size[v] <= total for v in names)
