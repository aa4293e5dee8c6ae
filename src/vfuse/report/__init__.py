"""Explain what vfuse runs for a model and why: kernels, bytes, decisions (text, JSON, HTML, Graphviz)."""

from vfuse.report.explain import build_report, explain
from vfuse.report.model import FusionReport
from vfuse.report.rows import KernelRow, RunKind

__all__ = ["FusionReport", "KernelRow", "RunKind", "build_report", "explain"]
