"""Planning with symbolic sizes: which fusion decisions change within the symbols' range.

The planner prices a graph with symbolic sizes at its hints (ir/sym.py `hint`). `flips` plans
the same graph again with every symbol at the low and at the high end of where it is expected
(its range, capped: `far_hints`), and names each candidate merge accepted at one point and
rejected at another: the program serves every size, but those choices are the hint's. The
guards the replanning takes are its own (the env's are restored): nothing of it reaches the
compiled program. `size_flips` does the same for any choices a callback names (the schedule's:
`schedule/choices.py`), one symbol at a time, and finds the size where each one changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from vfuse.fusion.plan import Decision, FusionPlan
from vfuse.ir import Graph
from vfuse.ir.sym import SymEnv
from vfuse.targets import Target

FAR = 64  # the high point: the hint times this, within the symbol's range
# Steps of the search for where a choice changes, per symbol and side (each one schedules again).
SEARCH_STEPS = 24


def far_hints(env: SymEnv) -> list[dict]:
    """Hints at the low end (the range's minimum) and the high end (hint x FAR, capped)."""
    low = {s: max(int(r.lower), 2) for s, r in env.ranges.items()}
    high = {s: int(min(env.hints[s] * FAR, r.upper)) for s, r in env.ranges.items()}
    return [low, high]


@contextmanager
def hints_at(env: SymEnv, hints: dict) -> Iterator[None]:
    """Plan as if the sizes were `hints`; the env's hints and guards come back afterwards."""
    saved = (env.hints, env.guards, env._seen, env.frozen)
    env.hints, env.guards, env._seen, env.frozen = dict(hints), [], set(), False
    try:
        yield
    finally:
        env.hints, env.guards, env._seen, env.frozen = saved


def _key(d: Decision) -> tuple:
    return (d.producer, d.consumer)


def flips(graph: Graph, plan: FusionPlan, env: SymEnv, target: Target) -> list[str]:
    """One line per merge decided differently at another point of the range than at the hint."""
    from vfuse.fusion.planner import plan_fusion

    at_hint = {_key(d): d.accepted for d in plan.decisions}
    out: list[str] = []
    for hints in far_hints(env):
        with hints_at(env, hints):
            other = plan_fusion(graph, target)
        where = ", ".join(f"{s.name}={v}" for s, v in hints.items())
        for d in other.decisions:
            was = at_hint.get(_key(d))
            if was is not None and was != d.accepted:
                verb = "fused" if d.accepted else "kept apart"
                out.append(f"%{d.producer[-1]} -> %{d.consumer[-1]}: {verb} at {where} [{d.rule.value}]")
        groups = {g.nodes for g in other.groups}
        if groups != {g.nodes for g in plan.groups} and not out:
            out.append(f"the kernels differ at {where}")
    return out


Choices = Callable[[], Mapping[str, str]]


def size_flips(env: SymEnv, choices: Choices) -> list[str]:
    """One line per choice `choices()` (name -> value at the env's hints) makes otherwise at another
    size of one symbol, the others at their hints: at the symbol's low end or at FAR x its hint
    (within its range), with the size nearest the hint where it changes (bisection, monotone
    between the hint and that end assumed)."""
    with hints_at(env, env.hints):
        base = dict(choices())
    out: list[str] = []
    ends = far_hints(env)
    for s in env.symbols:
        seen: dict[int, Mapping[str, str]] = {env.hints[s]: base}

        def at(n: int, s: object = s, seen: dict = seen) -> Mapping[str, str]:
            if n not in seen:
                with hints_at(env, {**env.hints, s: n}):
                    seen[n] = dict(choices())
            return seen[n]

        for end in (ends[0][s], ends[1][s]):
            if end == env.hints[s]:
                continue
            changed = [key for key, value in at(end).items() if key in base and base[key] != value]
            if set(at(end)) != set(base):
                out.append(f"the kernels differ at {s.name}={end} (here {s.name}={env.hints[s]})")
            out += [_where(key, base[key], s.name, env.hints[s], end, at) for key in changed]
    return out


def _where(key: str, here: str, name: str, hint: int, end: int, at: Callable[[int], Mapping[str, str]]) -> str:
    """`key: here at name=hint; other from name=n on` (or `up to name=n` below the hint)."""
    near, far = hint, end  # at(near)[key] == here != at(far)[key]
    for _ in range(SEARCH_STEPS):
        if abs(far - near) <= 1:
            break
        mid = (near + far) // 2
        near, far = (mid, far) if at(mid).get(key) == here else (near, mid)
    side = "from" if end > hint else "up to"
    exact = "" if abs(far - near) <= 1 else f" (changes between {min(near, far)} and {max(near, far)})"
    return f"{key}: {here} at {name}={hint}; {at(far).get(key, '?')} {side} {name}={far}{exact}"
