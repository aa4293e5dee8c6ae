"""The on-chip pressure rule, measured: fit a plan's kernels to the target's registers and shared memory.

The cost model's register budget (`Rule.REGISTER_BUDGET`) estimates live values per point; what
a kernel really takes is known only once it is compiled. `fit_on_chip` asks an `OnChipProbe`
(given by the compiler: it schedules and renders the plan as Triton kernels and compiles them
offline for the target's SM, `codegen/triton/offline.py`) for each group's registers, spilled
bytes and shared memory. A group whose kernel spills or asks for more shared memory than one SM
has is first re-tiled (`Group.retile`: the schedule's GPU table gives its kernel fewer elements
per thread, `schedule/gpu.py`), up to `MAX_RETILE` times, and measured again; if it still does,
it is split: the plan is made again with at most half of that group's nodes allowed in one
kernel (`NodeCap`, checked by the planner like any budget), up to `MAX_ROUNDS` times. A group of
one node cannot be split and is kept, logged as such. Every decision then carries the measured
figures of the kernel its nodes ended up in (`Rule.ONCHIP_FITS` / `ONCHIP_SPILLS` / `ONCHIP_SHARED`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from vfuse.fusion.legality import Budgets, NodeCap
from vfuse.fusion.plan import Decision, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.targets import Target

MAX_ROUNDS = 4  # splits
MAX_RETILE = 2  # re-tilings of one group's kernel before it is split (`Group.retile`)
# Compute capability of each GPU preset: what its kernels are compiled for.
SM = {"a100": 80, "h100": 90, "h200": 90}


@dataclass(frozen=True)
class OnChip:
    """One group's kernel compiled for an SM (the largest figures over the group's kernels)."""

    sm: int
    registers: int  # per thread
    spill_bytes: int  # per thread, stored to local memory
    shared_bytes: int  # per program

    def describe(self) -> str:
        return f"sm_{self.sm}: {self.registers} registers, {self.spill_bytes} B spilled, {self.shared_bytes} B shared"

    def worst(self, other: OnChip | None) -> OnChip:
        """The larger figures of two kernels of one group."""
        if other is None:
            return self
        return OnChip(
            self.sm,
            max(self.registers, other.registers),
            max(self.spill_bytes, other.spill_bytes),
            max(self.shared_bytes, other.shared_bytes),
        )

    def problem(self, target: Target) -> Rule | None:
        """The rule this kernel breaks on `target`, if any."""
        if self.spill_bytes:
            return Rule.ONCHIP_SPILLS
        if self.shared_bytes > target.smem_per_sm:
            return Rule.ONCHIP_SHARED
        return None


class OnChipProbe(Protocol):
    """Measures the kernels a plan would run: group id -> figures (groups run through torch,
    or that could not be compiled, are left out)."""

    def __call__(self, plan: FusionPlan, sm: int) -> Mapping[int, OnChip]: ...


def fit_on_chip(
    target: Target, probe: OnChipProbe, replan: Callable[[Budgets], FusionPlan], budgets: Budgets | None = None
) -> FusionPlan:
    """The plan `replan(budgets)` makes, with every group that spills or overflows shared memory
    re-tiled (up to `MAX_RETILE` times: `Group.retile`, read by the schedule's GPU tables), then,
    if it still does, split (re-planned under a node cap); every decision annotated with
    measured figures."""
    budgets = budgets or Budgets()
    sm = SM.get(target.name, 90)
    levels: dict[frozenset[str], int] = {}  # re-tiling of a node set, kept across re-plans
    plan = replan(budgets)
    log: list[Decision] = []
    splits = 0
    while True:
        plan = dataclasses.replace(
            plan, groups=tuple(dataclasses.replace(g, retile=levels.get(frozenset(g.nodes), 0)) for g in plan.groups)
        )
        figures = probe(plan, sm)
        caps = []
        for g in plan.groups:
            f = figures.get(g.id)
            rule = f.problem(target) if f else None
            if f is None or rule is None:
                continue
            if g.retile < MAX_RETILE:
                levels[frozenset(g.nodes)] = g.retile + 1
                log.append(_over(g, f, rule, target, "re-tiled"))
                continue
            split = len(g.nodes) > 1 and splits < MAX_ROUNDS
            log.append(_over(g, f, rule, target, "split" if split else "kept"))
            if split:
                caps.append(NodeCap(frozenset(g.nodes), max(1, len(g.nodes) // 2), rule, f.describe()))
        if not caps and all(levels.get(frozenset(g.nodes), 0) == g.retile for g in plan.groups):
            return _annotated(plan, figures, log, target)
        if caps:
            splits += 1
            budgets = dataclasses.replace(budgets, caps=budgets.caps + tuple(caps))
            plan = replan(budgets)


def _over(g: Group, f: OnChip, rule: Rule, target: Target, action: str) -> Decision:
    limit = (
        "registers spill to local memory"
        if rule is Rule.ONCHIP_SPILLS
        else f"> {target.smem_per_sm} B shared memory per SM"
    )
    what = {
        "re-tiled": f"re-tiled: level {g.retile + 1} of {MAX_RETILE} (half the elements per thread)",
        "split": f"split: at most {max(1, len(g.nodes) // 2)} of its {len(g.nodes)} nodes per kernel",
        "kept": "kept: it cannot be split further",
    }[action]
    return Decision(g.nodes, g.nodes, False, rule, f"kernel of group {g.id} measured {f.describe()} ({limit}); {what}")


def _annotated(plan: FusionPlan, figures: Mapping[int, OnChip], log: list[Decision], target: Target) -> FusionPlan:
    """`plan` with the measured figures on every accepted decision (of the kernel its nodes run
    in) and a decision per measured group that fits, the splits logged after them."""
    where = {n: g.id for g in plan.groups for n in g.nodes}
    decisions = []
    for d in plan.decisions:
        f = figures.get(where.get(d.consumer[0], -1)) if d.accepted and d.consumer else None
        decisions.append(dataclasses.replace(d, reason=f"{d.reason}; measured {f.describe()}") if f else d)
    for g in plan.groups:
        f = figures.get(g.id)
        if f is not None and f.problem(target) is None:
            tiles = f" (re-tiled, level {g.retile})" if g.retile else ""
            decisions.append(Decision(g.nodes, g.nodes, True, Rule.ONCHIP_FITS, f"group {g.id} {f.describe()}{tiles}"))
    return dataclasses.replace(plan, decisions=tuple(decisions + log))
