"""The report as rich tables: a summary, one row per kernel, and the planner's decision log.

`renderables` gives the tables (the CLI prints them in colour on a terminal); `render_text`
records them into plain text without escape codes, which is what `str(report)` returns.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from vfuse.fusion.plan import Decision
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport


def render_text(report: FusionReport, width: int = 120) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    for part in renderables(report):
        console.print(part)
    # rich pads every line to the full width; trailing blanks only make diffs and pipes noisy.
    return "\n".join(line.rstrip() for line in console.export_text(styles=False).splitlines()) + "\n"


def renderables(report: FusionReport) -> list[RenderableType]:
    return [summary_table(report), kernel_table(report), decision_table(report)]


def summary_table(report: FusionReport) -> Table:
    t = Table(title=f"vfuse fusion report (target: {report.target})", box=box.SIMPLE, show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("ops -> kernels", f"{_count(report.num_ops, 'op')} -> {_count(report.num_kernels, 'kernel')}")
    t.add_row(
        "DRAM bytes",
        f"unfused {fmt_bytes(report.bytes_unfused)} -> fused {fmt_bytes(report.bytes_fused)}"
        f" ({fmt_ratio(report.bytes_unfused, report.bytes_fused) or 'n/a'} less);"
        f" lower bound {fmt_bytes(report.bytes_lower_bound)}",
    )
    speedup = fmt_ratio(report.time_unfused_s, report.time_fused_s)
    t.add_row(
        "predicted time",
        f"unfused {fmt_time(report.time_unfused_s)} -> fused {fmt_time(report.time_fused_s)}"
        + (f" ({speedup} faster)" if speedup else ""),
    )
    t.add_row("decisions", f"{len(report.accepted)} accepted, {len(report.rejected)} rejected")
    if report.recomputed:
        items = [f"%{n} in kernels {_ids(k)}" for n, k in report.recomputed.items()]
        more = f"; +{len(items) - 4} more" if len(items) > 4 else ""
        t.add_row("recomputed", "; ".join(items[:4]) + more)
    fallbacks = ", ".join(f"{name} x{count}" for name, count in report.fallbacks.items())
    t.add_row("torch fallbacks", fallbacks or "none")
    return t


def kernel_table(report: FusionReport) -> Table:
    t = Table(title="kernels", box=box.SIMPLE_HEAD, title_justify="left", expand=True)
    # Figures and names never wrap (value lists go one per line); the op chain takes the rest.
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("label", no_wrap=True)
    t.add_column("ops", ratio=1)
    t.add_column("time", justify="right", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("bound", no_wrap=True)
    t.add_column("reads", no_wrap=True)
    t.add_column("writes", no_wrap=True)
    for g in report.groups:
        t.add_row(
            str(g.id),
            g.label,  # the kind is implied by the label (gemm, row, ...) and shown in the HTML table
            report.op_chain(g),
            fmt_time(g.time_s),
            fmt_bytes(g.bytes),
            g.bound,
            _column(g.inputs),
            _column(g.outputs),
        )
    return t


def decision_table(report: FusionReport) -> Table | Text:
    if not report.decisions:
        return Text("decisions: none logged (nothing could be fused)")
    t = Table(title="decisions (producer -> consumer)", box=box.SIMPLE_HEAD, title_justify="left", expand=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("producer -> consumer", max_width=30)
    t.add_column("gain", justify="right", no_wrap=True)
    t.add_column("rule / reason", ratio=1)  # the prose takes the width that is left
    for i, d in enumerate(report.decisions):
        why = Text(d.rule.value, style="bold")
        if d.reason:
            why.append("\n" + d.reason)
        t.add_row(
            str(i),
            _verdict(d),
            f"{fmt_names(d.producer, 2)}\n-> {fmt_names(d.consumer, 2)}",
            "-" if d.gain_s is None else fmt_time(d.gain_s),
            why,
        )
    return t


def _verdict(d: Decision) -> Text:
    word = "accepted" if d.accepted else "rejected"
    if d.horizontal:
        word += " (horiz.)"
    return Text(word, style="green" if d.accepted else "red")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(map(str, ids))


def _column(names: tuple[str, ...], limit: int = 3) -> str:
    """Value names one per line, so that no name is ever broken: '%a\\n%b\\n+2 more'."""
    lines = [f"%{n}" for n in names[:limit]]
    return "\n".join(lines + ([f"+{len(names) - limit} more"] if len(names) > limit else []))
