"""Printed form of a FusionPlan for dumps (`04_plan.txt`) and golden tests.

plan for cpu: 2 kernels from 9 nodes, predicted 3.1us, 1.05 MB moved
kernel 0 row: %s, %mean, ... <- (%x, %w) -> (%y)
  flops 2.1e+05, bytes 5.2e+05, t 1.6us (memory-bound), pressure 0.09, parallelism 32
decisions: 8 accepted, 3 rejected
  + %a -> %b [elementwise-into-any] gain 1.2us: merged into pointwise kernel; ...
  - %c -> %d [two-contractions]: at most one contraction per kernel
"""

from __future__ import annotations

from vfuse.fusion.plan import Decision, FusionPlan, Group


def _names(names: tuple[str, ...], limit: int = 8) -> str:
    shown = ", ".join(f"%{n}" for n in names[:limit])
    return shown + (f", ... ({len(names)} nodes)" if len(names) > limit else "")


def _short(names: tuple[str, ...]) -> str:
    """A kernel named by its last node (the one its outputs usually come from) and its size."""
    return f"%{names[-1]}" if len(names) == 1 else f"%{names[-1]}(+{len(names) - 1})"


def format_group(g: Group) -> str:
    c = g.cost
    head = f"kernel {g.id} {g.label}: {_names(g.nodes)} <- ({_names(g.inputs)}) -> ({_names(g.outputs)})"
    figures = (
        f"  flops {c.flops:.3g}, bytes {c.bytes:.3g}, t {c.time_s * 1e6:.3g}us ({c.bound}-bound), "
        f"pressure {c.pressure:.2f}, parallelism {c.parallelism:.3g}"
    )
    return f"{head}\n{figures}"


def format_decision(d: Decision) -> str:
    mark = "+" if d.accepted else "-"
    gain = f" gain {d.gain_s * 1e6:.3g}us" if d.gain_s is not None else ""
    horizontal = " horizontal" if d.horizontal else ""
    return f"  {mark} {_short(d.producer)} -> {_short(d.consumer)} [{d.rule.value}]{horizontal}{gain}: {d.reason}"


def format_plan(plan: FusionPlan) -> str:
    nodes = len({n for g in plan.groups for n in g.nodes})
    total_t = sum(g.cost.time_s for g in plan.groups)
    total_b = sum(g.cost.bytes for g in plan.groups)
    lines = [
        f"plan for {plan.target}: {len(plan.groups)} kernels from {nodes} nodes, "
        f"predicted {total_t * 1e6:.3g}us, {total_b / 1e6:.3g} MB moved"
    ]
    lines += [format_group(g) for g in plan.groups]
    accepted = sum(d.accepted for d in plan.decisions)
    lines.append(f"decisions: {accepted} accepted, {len(plan.decisions) - accepted} rejected")
    lines += [format_decision(d) for d in plan.decisions]
    return "\n".join(lines)
