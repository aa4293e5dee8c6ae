"""Fusion planning: kernel forms and legality, the cost model, and the priority-fusion planner."""

from vfuse.fusion.cost import estimate, lower_bound_bytes
from vfuse.fusion.format import format_plan
from vfuse.fusion.legality import Budgets
from vfuse.fusion.plan import Cost, Decision, FusionPlan, Group
from vfuse.fusion.planner import plan_fusion

__all__ = [
    "Budgets",
    "Cost",
    "Decision",
    "FusionPlan",
    "Group",
    "estimate",
    "format_plan",
    "lower_bound_bytes",
    "plan_fusion",
]
