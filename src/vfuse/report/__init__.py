"""Explain a fusion plan: what vfuse fuses into which kernels, and why (text, HTML, Graphviz)."""

from vfuse.report.explain import build_report, explain
from vfuse.report.model import FusionReport, KernelRow

__all__ = ["FusionReport", "KernelRow", "build_report", "explain"]
