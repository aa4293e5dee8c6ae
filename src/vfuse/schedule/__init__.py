"""Scheduling: turn a FusionPlan into a Program of loop-nest kernels, torch steps and an arena plan."""

from vfuse.schedule.build import build
from vfuse.schedule.kernel import Buffer, BufKind, Kernel, MemoryPlan, Program, Segment, TorchStep
from vfuse.schedule.lower import Unsupported

__all__ = ["BufKind", "Buffer", "Kernel", "MemoryPlan", "Program", "Segment", "TorchStep", "Unsupported", "build"]
