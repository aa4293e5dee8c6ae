"""Merged passes of a looped GPU row kernel (`GpuLaunch.merges`, decided in `schedule/gpu.py`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RowMethod(enum.Enum):
    """How a looped row kernel (`GpuLaunch`, not persistent) gets two statistics in one read of
    the row instead of a walk per pass (`schedule/gpu.py` decides, `codegen/triton/rows.py` renders)."""

    # sum(x), then sum((x - c)^2) (and maybe sum(x - c)): per-lane count, mean and M2 (Chan's merge per row)
    WELFORD = "welford"
    ONLINE_SOFTMAX = "online softmax"  # max(x), then sum(exp(x - max)): per-lane running max, rescaled sum


@dataclass(frozen=True)
class RowMerge:
    """Passes `first` and `first + 1` of a looped row kernel walked as one: `x` is the element
    value both reduce (`first`'s reduction's argument); `shift` the per-row value the second pass
    subtracts from it (WELFORD: any value defined before pass `first + 1`; ONLINE_SOFTMAX: the max);
    `deviations` the second pass's sum(x - shift) where it takes one too (WELFORD, the corrected
    mean of frontend/lower_reduce.py)."""

    first: int
    method: RowMethod
    x: str
    shift: str
    deviations: str | None = None
