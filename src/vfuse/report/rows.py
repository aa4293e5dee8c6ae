"""One row of the report: a kernel that runs, how it runs, and what the cost model predicts for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RunKind(enum.Enum):
    """How a kernel of the report runs."""

    NATIVE = "native"  # a generated loop nest (pointwise, row, lookup table)
    TEMPLATE = "template"  # a GEMM / conv / attention template with its fused epilogue
    TORCH = "torch"  # IR nodes run through torch one by one (fallbacks; the reference executor)


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One kernel that runs: a generated kernel or a torch step of the schedule's Program.

    id: position in run order; name: the generated C++ function ("k2_c"; "torch<id>" for a torch
        step); group: the planner group it came from (a group may run as several kernels);
        segment: the native call (`extern "C"` entry) running it, "" for torch.
    nodes/ops: the IR nodes it computes, in order (`op_label` spells out a fallback's torch op).
    kind: the planner group's dominant op kind (lower-case Kind name); label: the planner's label.
    pattern: what the nodes form ("LayerNorm row kernel"); module: the module path of its main node.
    time_s, flops, bytes, ...: the cost model's prediction for exactly these nodes (None when the
        model cannot price them); measured_s: median measured time (`FusionReport.with_measured`; None:
        not profiled); best_s: the fastest profiled run (on a loaded machine, what the kernel can do).
    note: why a torch step runs through torch.
    """

    id: int
    name: str
    runs: RunKind
    group: int
    segment: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    kind: str
    label: str
    pattern: str
    module: str
    modules: tuple[str, ...]
    time_s: float | None
    flops: int
    bytes: int
    bound: str
    pressure: float
    parallelism: float
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    note: str = ""
    measured_s: float | None = None
    best_s: float | None = None


# What the predicted speedup compares with: one kernel per op, priced by the same cost model. It is
# not a measurement against eager PyTorch, and every rendering says so next to the ratio.
BASELINE = "vs unfused (cost model)"
