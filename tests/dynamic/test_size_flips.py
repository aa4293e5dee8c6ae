"""`fusion.flips.size_flips`: choices named by a callback, scheduled again one symbol at a time, are
reported with the exact size where they change, above and below the hint; choices that hold over
the range are not reported; the env's hints and guards are as before. No g++: the choices are a
function of the hints."""

from __future__ import annotations

import sympy
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.fusion.flips import FAR, size_flips
from vfuse.ir.sym import SymEnv

R, C = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)


def _env() -> SymEnv:
    return SymEnv({R: (100, ValueRanges(2, sympy.oo)), C: (600, ValueRanges(2, 4000))})


def test_each_change_is_named_with_its_size() -> None:
    env = _env()
    n, d = env.size(R), env.size(C)

    def choices() -> dict[str, str]:
        elements = (n * d).hint
        return {
            "k0 threads": "several" if elements >= 32768 else "one",  # 55 rows of 600; 328 columns of 100
            "k0 walk": "row groups" if d.hint <= 999 else "rows",  # the width alone
            "k0 tile": "8x16",  # the same everywhere
        }

    env.guards.append(sympy.Ge(R, 2))
    lines = size_flips(env, choices)
    assert lines == [
        "k0 threads: several at s0=100; one up to s0=54",
        "k0 threads: several at s1=600; one up to s1=327",
        "k0 walk: row groups at s1=600; rows from s1=1000",
    ]
    assert env.hints == {R: 100, C: 600} and env.guards == [sympy.Ge(R, 2)]


def test_the_high_end_is_far_times_the_hint_within_the_range() -> None:
    env = _env()
    n = env.size(R)
    seen: list[int] = []

    def choices() -> dict[str, str]:
        seen.append(n.hint)
        return {"k0 prefetch": "none" if n.hint > 100 * FAR - 1 else "3 rows ahead"}

    assert size_flips(env, choices) == [f"k0 prefetch: 3 rows ahead at s0=100; none from s0={100 * FAR}"]
    assert max(seen) == 100 * FAR  # s1's end is its range's 4000, s0's the hint x FAR
