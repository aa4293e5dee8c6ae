"""The report as rich tables: a summary, one row per kernel that runs, and the planner's decision log.

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
from vfuse.report.rows import BASELINE, KernelRow, RunKind
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport


def render_text(report: FusionReport, width: int = 120, summary: bool = False) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    for part in renderables(report, summary):
        console.print(part)
    # rich pads every line to the full width; trailing blanks only make diffs and pipes noisy.
    return "\n".join(line.rstrip() for line in console.export_text(styles=False).splitlines()) + "\n"


def renderables(report: FusionReport, summary: bool = False) -> list[RenderableType]:
    """Full: totals, one row per kernel with its ops, every decision. Summary: totals, one line
    per kernel, decisions counted by rule (a 6-block transformer fits on a screen or two)."""
    if summary:
        return [summary_table(report), kernel_table(report, ops=False), rule_table(report)]
    return [summary_table(report), kernel_table(report), decision_table(report)]


def summary_table(report: FusionReport) -> Table:
    tier = f", {report.isa}" if report.isa else ""
    t = Table(title=f"vfuse fusion report (target: {report.target}{tier})", box=box.SIMPLE, show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("runs", runs_line(report))
    t.add_row("planned", planned_line(report))
    t.add_row(
        "DRAM bytes",
        f"unfused {fmt_bytes(report.bytes_unfused)} -> fused {fmt_bytes(report.bytes_fused)}"
        f" ({fmt_ratio(report.bytes_unfused, report.bytes_fused) or 'n/a'} less);"
        f" lower bound {fmt_bytes(report.bytes_lower_bound)}",
    )
    t.add_row("predicted time", time_line(report))
    if report.profiled:
        t.add_row("measured time", f"kernels {fmt_time(report.time_measured_s)} (median of each, g.profile)")
    t.add_row("decisions", f"{len(report.accepted)} accepted, {len(report.rejected)} rejected")
    if report.recomputed:
        items = [f"%{n} in kernels {_ids(k)}" for n, k in report.recomputed.items()]
        more = f"; +{len(items) - 4} more" if len(items) > 4 else ""
        t.add_row("recomputed", "; ".join(items[:4]) + more)
    for origin, choice in report.lowering_choices.items():
        t.add_row("lowered as", f"%{origin}: {choice}")
    fallbacks = ", ".join(f"{name} x{count}" for name, count in report.fallbacks.items())
    t.add_row("torch fallbacks", fallbacks or "none")
    if report.symbols:
        t.add_row("symbolic sizes", "; ".join(report.symbols))
        t.add_row("specialized on", "; ".join(report.guards) or "nothing: one program for every size")
        t.add_row("decisions that flip", "; ".join(report.flips) or "none within the range")
    return t


def runs_line(report: FusionReport) -> str:
    """What a call runs, as CompiledGraph.stats counts it: '11 native kernels in 1 native call, 0 torch calls'."""
    line = (
        f"{_count(report.num_kernels, 'native kernel')} in {_count(report.native_calls, 'native call')},"
        f" {_count(report.torch_calls, 'torch call')}"
    )
    return line + (f" ({report.note})" if report.note else "")


def planned_line(report: FusionReport) -> str:
    """'59 ops -> 7 planner groups; code generation runs 2 of them as several kernels'."""
    line = f"{_count(report.num_ops, 'op')} -> {_count(report.num_groups, 'planner group')}"
    split = report.split_groups
    return line + (f"; code generation runs {len(split)} of them as several kernels" if split else "")


def time_line(report: FusionReport) -> str:
    speedup = fmt_ratio(report.time_unfused_s, report.time_fused_s)
    return f"unfused {fmt_time(report.time_unfused_s)} -> fused {fmt_time(report.time_fused_s)}" + (
        f" ({speedup} faster {BASELINE})" if speedup else ""
    )


def kernel_table(report: FusionReport, ops: bool = True) -> Table:
    t = Table(title="kernels (in run order)", box=box.SIMPLE_HEAD, title_justify="left", expand=True)
    # Figures and names never wrap; the op chain takes the width that is left.
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("kernel", no_wrap=True)
    t.add_column("pattern / module", ratio=1 if not ops else None, max_width=None if not ops else 40)
    if ops:
        t.add_column("ops", ratio=1)
    t.add_column("time", justify="right", no_wrap=True)
    measured = report.profiled
    if measured:
        t.add_column("measured", justify="right", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("bound", no_wrap=True)
    for k in report.kernels:
        what = k.pattern + (f"\n{k.module}" if k.module else "")
        cells = [str(k.id), _kernel_name(k), what, *([report.op_chain(k)] if ops else [])]
        times = [fmt_time(k.time_s), *([fmt_time(k.measured_s)] if measured else [])]
        t.add_row(*cells, *times, fmt_bytes(k.bytes), k.bound)
    return t


def _kernel_name(k: KernelRow) -> str:
    """'k2_c' with how it runs: 'k2_c\ntemplate'; a torch step says torch."""
    return k.name if k.runs is RunKind.TORCH else f"{k.name}\n{k.runs.value}"


def rule_table(report: FusionReport) -> Table | Text:
    """Decisions counted by rule, most frequent first."""
    if not report.decisions:
        return Text("decisions: none logged (nothing could be fused)")
    counts: dict[str, list[int]] = {}
    for d in report.decisions:
        counts.setdefault(d.rule.value, [0, 0])[0 if d.accepted else 1] += 1
    t = Table(title="decisions by rule", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("rule")
    t.add_column("accepted", justify="right")
    t.add_column("rejected", justify="right")
    for rule, (yes, no) in sorted(counts.items(), key=lambda kv: -sum(kv[1])):
        t.add_row(rule, str(yes), str(no))
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


def _ids(ids: tuple[int, ...], limit: int = 6) -> str:
    shown = ", ".join(f"#{i}" for i in ids[:limit])
    return shown + (f" +{len(ids) - limit} more" if len(ids) > limit else "")


def profile_table(report: FusionReport) -> Table:
    """`vfuse profile`: each kernel's predicted and measured time and their ratio, with totals."""
    t = Table(title="kernels: predicted vs measured", box=box.SIMPLE_HEAD, title_justify="left")
    for name, right in (("#", True), ("kernel", False), ("runs", False), ("pattern", False), ("bound", False)):
        t.add_column(name, justify="right" if right else "left", no_wrap=name != "pattern")
    for name in ("predicted", "measured", "best", "pred/meas"):
        t.add_column(name, justify="right", no_wrap=True)
    for k in report.kernels:
        times = (fmt_time(k.time_s), fmt_time(k.measured_s), fmt_time(k.best_s))
        t.add_row(str(k.id), k.name, k.runs.value, k.pattern, k.bound, *times, _ratio(k.time_s, k.measured_s))
    best = [k.best_s for k in report.kernels]
    best_total = sum(b for b in best if b is not None) if best and None not in best else None
    total = _ratio(report.time_fused_s, report.time_measured_s)
    times = (fmt_time(report.time_fused_s), fmt_time(report.time_measured_s), fmt_time(best_total))
    t.add_row("", "total", "", "", "", *times, total)
    return t


def _ratio(predicted: float | None, measured: float | None) -> str:
    return f"{predicted / measured:.2f}" if predicted is not None and measured else "-"


def profile_data(report: FusionReport) -> dict[str, object]:
    """`vfuse profile --json`: the machine, and per kernel its figures, both times and their ratio."""
    keys = ("id", "name", "pattern", "segment", "flops", "bytes", "bound", "measured_s", "best_s")
    rows = [
        {"runs": k.runs.value, **{f: getattr(k, f) for f in keys}, "predicted_s": k.time_s}
        | {"ratio": k.time_s / k.measured_s if k.time_s is not None and k.measured_s else None}
        for k in report.kernels
    ]
    return {"target": report.target, "isa": report.isa, "kernels": rows}
