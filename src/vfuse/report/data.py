"""The report as plain JSON-able data (`FusionReport.to_json`, `vfuse explain --json`).

Times are in seconds and sizes in bytes, unformatted; the speedup names its baseline.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from vfuse.fusion.plan import Decision
from vfuse.report.rows import BASELINE

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport, KernelRow


def report_data(report: FusionReport) -> dict[str, Any]:
    fused, unfused = report.time_fused_s, report.time_unfused_s
    return {
        "target": report.target,
        "backend": report.backend,
        "note": report.note,
        "runs": {
            "kernels": report.num_kernels,
            "native_calls": report.native_calls,
            "torch_calls": report.torch_calls,
        },
        "planned": {
            "ops": report.num_ops,
            "groups": report.num_groups,
            "split_groups": {str(g): list(ids) for g, ids in report.split_groups.items()},
        },
        "bytes": {
            "unfused": report.bytes_unfused,
            "fused": report.bytes_fused,
            "lower_bound": report.bytes_lower_bound,
        },
        "time": {
            "unfused_s": unfused,
            "fused_s": fused,
            "speedup": unfused / fused if unfused is not None and fused else None,
            "baseline": BASELINE,
        },
        "fallbacks": dict(report.fallbacks),
        "recomputed": {n: list(ids) for n, ids in report.recomputed.items()},
        "lowered_as": report.lowering_choices,
        "kernels": [kernel_data(k) for k in report.kernels],
        "decisions": [decision_data(d) for d in report.decisions],
    }


def kernel_data(k: KernelRow) -> dict[str, Any]:
    data = dataclasses.asdict(k)
    data["runs"] = k.runs.value
    for name in ("nodes", "ops", "modules", "inputs", "outputs"):
        data[name] = list(data[name])
    return data


def decision_data(d: Decision) -> dict[str, Any]:
    """Every Decision field (newer planner figures too), the rule as its name and meaning."""
    data = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
    data["producer"], data["consumer"] = list(d.producer), list(d.consumer)
    data["rule"], data["meaning"] = d.rule.value, d.rule.meaning
    return data
