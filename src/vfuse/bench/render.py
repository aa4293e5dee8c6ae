"""Presenting results: rich tables for the terminal and a matplotlib bar chart of ratios."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vfuse.bench.contenders import REFERENCE
from vfuse.bench.results import CompileTime, ContenderResult, MachineInfo, RunResult, WorkloadResult
from vfuse.bench.timing import Stats

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _ratio_text(value: float | None) -> Text:
    if value is None:
        return Text("-")
    # Green only when clearly faster: under 5 % is within the noise of a shared machine.
    style = "green" if value >= 1.05 else "red" if value <= 0.95 else ""
    return Text(f"{value:.3g}x", style=style)


def _check_text(result: ContenderResult) -> Text:
    if result.status == "error":
        return Text("ERROR", style="bold red")
    if result.check is None:
        return Text("-")
    if not result.check.ok:
        return Text(f"MISMATCH {result.check.max_abs_err:.2g}", style="bold white on red")
    return Text(f"ok {result.check.max_abs_err:.1g}", style="green")


def _plural(count: object, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _built_text(stats: dict[str, Any] | None) -> Text:
    """What the backend built, e.g. "3 kernels, 1 fallback"; graphs run eagerly shown in red."""
    if not stats:
        return Text("")
    parts = [_plural(stats.get("kernels", "?"), "kernel")]
    fallbacks = sum((stats.get("fallbacks") or {}).values())
    if fallbacks:
        parts.append(_plural(fallbacks, "torch op"))
    text = Text(", ".join(parts))
    if stats.get("eager_graphs"):
        text.append(f", {stats['eager_graphs']} graphs eager", style="bold red")
    return text


def _iqr(stats: Stats | None) -> str:
    return "-" if stats is None else f"±{fmt_seconds(stats.iqr_s / 2)}"


def _add_workload_rows(table: Table, workload: WorkloadResult) -> None:
    label = f"{workload.name}\n{workload.minimal_bytes / 1e6:.3g} MB"
    for i, c in enumerate(workload.contenders):
        median = c.time.median_s if c.time else None
        table.add_row(
            label if i == 0 else "",
            c.name,
            fmt_seconds(median),
            _iqr(c.time),
            _ratio_text(c.speedup_vs_eager if c.name != REFERENCE else None),
            _ratio_text(c.speedup_vs_inductor),
            _fmt(c.gbps, ".1f"),
            _fmt(c.pct_copy, ".0f", " %"),
            _check_text(c),
            fmt_seconds(c.first_call_s),
            _built_text(c.backend_stats),
        )
    copy = workload.copy
    for name, stats, gbps in (("copy", copy.prealloc, copy.prealloc_gbps), ("copy_fresh", copy.fresh, copy.fresh_gbps)):
        pct = 100.0 * gbps / copy.prealloc_gbps
        table.add_row("", Text(name, style="dim"), fmt_seconds(stats.median_s), _iqr(stats), "", "",
                      f"{gbps:.1f}", f"{pct:.0f} %", "", "", "", style="dim")  # fmt: skip
    table.add_section()


def run_table(run: RunResult) -> Table:
    m = run.machine
    tunables = f", GLIBC_TUNABLES={m.glibc_tunables}" if m.glibc_tunables else ""
    table = Table(
        title=f"vfuse bench ({run.label}): {m.cpu_model}, {_isa(m)}, {m.threads} threads, torch {m.torch_version}"
        f"{tunables}",
        caption="median per call over interleaved rounds; ±IQR/2; ratios = eager (or inductor) median / this median",
    )
    for header in ("workload", "contender", "median", "±", "vs eager", "vs inductor", "GB/s", "% copy"):
        table.add_column(header, justify="left" if header in ("workload", "contender") else "right")
    table.add_column("check")
    table.add_column("1st call", justify="right")
    table.add_column("built")
    for workload in run.workloads:
        _add_workload_rows(table, workload)
    return table


def _isa(m: MachineInfo) -> str:
    """`vfuse code avx2 (CPU: avx512 (vbmi, vnni, bf16))` when a lower tier was forced."""
    if not m.isa:
        return "tier unknown"
    return f"vfuse code {m.isa}" + (f" (CPU: {m.cpu_isa})" if m.cpu_isa and m.cpu_isa != m.isa else "")


# A 1-minute load average above this when the run starts means other jobs were competing.
_BUSY_LOAD = 1.0


def print_run(console: Console, run: RunResult) -> None:
    console.print(run_table(run))
    load = run.machine.load_avg[0]
    if load >= _BUSY_LOAD:
        cpus = run.machine.logical_cpus
        console.print(f"[yellow]machine busy: load average {load:.1f} on {cpus} CPUs at start; figures are noisy[/]")
    # Failures go below the table in full: they must not be missed or truncated to a cell.
    for w in run.workloads:
        for c in w.contenders:
            if c.status == "error":
                console.print(f"[bold red]ERROR[/] {w.name}/{c.name}: {escape(c.error or '')}")
            elif c.status == "mismatch" and c.check is not None:
                console.print(f"[bold red]MISMATCH[/] {w.name}/{c.name}: {escape(c.check.detail)}")


_COMPILE_TITLE = (
    "compile times, each probe a fresh process: cold = empty caches; warm = the caches cold filled;"
    " 2nd graph = warm, after the process compiled another function with the same backend"
)
_COMPILE_CAPTION = (
    "1st call = first call - steady call (the compile a user waits for; gc = garbage-collector pauses in it,"
    " if >= 10 %); in backend = FX graph in, callable out (vfuse: VfuseBackend, inductor: compile_fx;"
    " both run AOTAutograd)"
)
_COMPILE_HEADERS = ("contender", "workload", "cold\n1st call", "cold\nin backend", "warm\n1st call",
                    "warm\nin backend", "warm, 2nd graph\n1st call", "warm, 2nd graph\nin backend",
                    "steady\ncall", "error")  # fmt: skip


def _with_gc(seconds: float | None, gc_s: float | None) -> str:
    """A first-call figure, and the collector's pauses in it where they explain much of it
    (>= 10 %: a full collection of torch's heap, ~0.1-0.4 s, falls where allocations say)."""
    text = fmt_seconds(seconds)
    return text if seconds is None or gc_s is None or gc_s < 0.1 * seconds else f"{text} (gc {fmt_seconds(gc_s)})"


def compile_times_table(rows: tuple[CompileTime, ...]) -> Table:
    table = Table(title=_COMPILE_TITLE, caption=_COMPILE_CAPTION)
    for header in _COMPILE_HEADERS:
        table.add_column(header, justify="left" if header in ("contender", "workload", "error") else "right")
    for r in rows:
        table.add_row(
            r.contender,
            r.workload,
            _with_gc(r.cold_compile_s, r.cold_gc_s),
            fmt_seconds(r.cold_backend_s),
            _with_gc(r.warm_compile_s, r.warm_gc_s),
            fmt_seconds(r.warm_backend_s),
            _with_gc(r.warm_process_compile_s, r.warm_process_gc_s),
            fmt_seconds(r.warm_process_backend_s),
            fmt_seconds(r.steady_call_s),
            Text(r.error or "", style="bold red"),
        )
    return table


def print_compile_times(console: Console, rows: tuple[CompileTime, ...]) -> None:
    console.print(compile_times_table(rows))


def write_png(runs: tuple[RunResult, ...], path: Path) -> None:
    """Grouped bars of speedup vs eager, one panel per run; mismatches get a red hatch."""
    import matplotlib  # lazy: an optional dependency, and slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 4.2 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        _plot_run(ax, run)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_run(ax: Axes, run: RunResult) -> None:
    names = [w.name for w in run.workloads]
    others = [c.name for c in run.workloads[0].contenders if c.name != REFERENCE] if run.workloads else []
    width = 0.8 / max(1, len(others))
    for k, contender in enumerate(others):
        results = [next(c for c in w.contenders if c.name == contender) for w in run.workloads]
        xs = [i + (k - (len(others) - 1) / 2) * width for i in range(len(names))]
        _plot_bars(ax, xs, width, contender, results)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("speedup vs eager (median, log)")
    ax.set_title(f"{run.label}: {run.machine.cpu_model}, {run.machine.threads} threads")
    ax.legend()


def _plot_bars(ax: Axes, xs: list[float], width: float, label: str, results: list[ContenderResult]) -> None:
    """Bars grow from 1x (up: faster than eager, down: slower); failures are labelled, not drawn."""
    # NaN leaves a gap for a contender that did not run (0 has no place on a log axis).
    ratios = [r.speedup_vs_eager or float("nan") for r in results]
    bars = ax.bar(xs, [v - 1.0 for v in ratios], width, bottom=1.0, label=label)
    for x, bar, ratio, r in zip(xs, bars, ratios, results, strict=True):
        if r.status == "error":
            ax.annotate("error", (x, 1.0), ha="center", va="bottom", color="red", fontsize=8, rotation=90)
            continue
        if r.status == "mismatch":
            bar.set_hatch("xx")
            bar.set_edgecolor("red")
        text = f"{ratio:.2g}x" + (" wrong" if r.status == "mismatch" else "")
        ax.annotate(text, (x, ratio), ha="center", va="bottom" if ratio >= 1 else "top", fontsize=7)


# --- vfuse bench --dynamic (bench/dynamic.py) -----------------------------------------------

_DYN_MODELS_CAPTION = (
    "graphs = graphs the backend compiled over the 5 lengths (Inductor: Dynamo's, one each); compile = sum over"
    " the 5 first calls of (first call - steady call); new size = first call at a 6th length after them, over"
    " its steady call (+ graphs it compiled); err = worst max abs error vs eager over all 6 lengths"
)
_DYN_STEADY_CAPTION = (
    "median per call, interleaved; dynamic = torch.compile(dynamic=True), first called at the hint size, then"
    " timed at the static build's size; ratio = dynamic / static (bar <= 1.15); new size: first call at a 3rd size"
    " after warm-up, over its steady call (bar <= 1 ms), + graphs it compiled; dynamo = capture alone"
    ' (backend="eager"): its dynamic - static is what Dynamo\'s dynamic guards and calls cost by themselves'
)


def _signed(seconds: float) -> str:
    """A time that may be negative (a first call faster than the steady median: noise)."""
    return f"-{fmt_seconds(-seconds)}" if seconds < 0 else fmt_seconds(seconds)


def _err_text(err: float | None, ok: bool) -> Text:
    if err is None:
        return Text("-")
    return Text(f"ok {err:.1g}", style="green") if ok else Text(f"MISMATCH {err:.2g}", style="bold white on red")


def _bar_text(value: str, ok: bool | None) -> Text:
    return Text(value) if ok is None else Text(value, style="green" if ok else "red")


def _model_row(r: dict[str, Any]) -> list[Any]:
    head = [r["model"], r["mode"], r["contender"], r["cache"]]
    if r.get("error"):
        return [*head, "", "", "", "", "", Text(r["error"], style="bold red")]
    calls = [*r["calls"], r["new_size"]]
    err = max(c["max_abs_err"] for c in calls)
    new = r["new_size"]
    graphs = f"{r['graphs']}" + (f" ({r['eager_graphs']} eager)" if r.get("eager_graphs") else "")
    steady = f"{fmt_seconds(calls[0]['steady_s'])} .. {fmt_seconds(calls[-2]['steady_s'])}"
    new_text = _signed(new["extra_s"]) + (f" +{new['graphs_compiled']} graphs" if new["graphs_compiled"] else "")
    ok_new = new["extra_s"] <= 1e-3 if r["contender"] == "vfuse" else None
    compiled = [graphs, str(r["dynamo_graphs"]), fmt_seconds(r["compile_s"]), steady]
    return [*head, *compiled, _bar_text(new_text, ok_new), _err_text(err, all(c["ok"] for c in calls))]


def dynamic_models_table(rows: list[dict[str, Any]], lengths: list[int], new_length: int) -> Table:
    table = Table(title=f"text models at lengths {lengths}, then {new_length}", caption=_DYN_MODELS_CAPTION)
    headers = ("model", "mode", "contender", "caches", "graphs", "dynamo\ngraphs", "compile", "steady\n1st .. 5th",
               "new size\nextra", "check")  # fmt: skip
    for h in headers:
        table.add_column(h, justify="left" if h in ("model", "mode", "contender", "caches", "check") else "right")
    for r in rows:
        table.add_row(*_model_row(r))
    return table


def _shape(shape: list[int] | tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


def _steady_row(r: dict[str, Any]) -> list[Any]:
    head = [r["workload"], r["contender"], f"{_shape(r['shape'])}\n(hint {_shape(r['hint_shape'])})"]
    ratio = r["ratio"]
    ratio_text = _bar_text("-" if ratio is None else f"{ratio:.3f}", None if ratio is None else ratio <= 1.15)
    if r["contender"] != "vfuse":
        ratio_text.style = ""
    extra = r["new_extra_s"]
    new = "-" if extra is None else _signed(extra) + (f" +{r['new_graphs']} graphs" if r["new_graphs"] else "")
    new_ok = None if extra is None or r["contender"] != "vfuse" else extra <= 1e-3
    errs = [e for e in (r["static_max_abs_err"], r["dynamic_max_abs_err"], r["new_max_abs_err"]) if e is not None]
    check = Text(r["error"], style="bold red") if r["error"] else _err_text(max(errs, default=None), r["ok"])
    times = [fmt_seconds(r["static_s"]), fmt_seconds(r["dynamic_s"]), ratio_text]
    graphs = f"{r['static_graphs']} / {r['dynamic_graphs']}"
    return [*head, *times, graphs, _shape(r["new_shape"]), _bar_text(new, new_ok), check]


def dynamic_steady_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="dynamic build vs static build at the same size", caption=_DYN_STEADY_CAPTION)
    headers = ("workload", "contender", "size", "static", "dynamic", "ratio", "graphs\nstatic / dyn", "new size",
               "new size\nextra", "check")  # fmt: skip
    for h in headers:
        table.add_column(h, justify="left" if h in ("workload", "contender", "size", "check") else "right")
    for r in rows:
        table.add_row(*_steady_row(r))
    return table


def print_dynamic(console: Console, doc: dict[str, Any]) -> None:
    m, config = doc["machine"], doc["config"]
    console.print(f"vfuse bench --dynamic: {m['cpu_model']}, {m['threads']} threads, torch {m['torch_version']}")
    if m["load_avg"][0] >= _BUSY_LOAD:
        console.print(f"[yellow]machine busy: load average {m['load_avg'][0]:.1f} at start; figures are noisy[/]")
    if doc["models"]:
        console.print(dynamic_models_table(doc["models"], config["lengths"], config["new_length"]))
    if doc["bars"]["models"]:
        console.print(dynamic_bars_table(doc["bars"]))
    if doc["steady"]:
        console.print(dynamic_steady_table(doc["steady"]))
    for r in doc["models"]:
        if r.get("error"):
            console.print(f"[bold red]ERROR[/] {r['model']}/{r['contender']}/{r['mode']}: {escape(r['error'])}")
    for r in doc["steady"]:
        if r["error"]:
            console.print(f"[bold red]ERROR[/] {r['workload']}/{r['contender']}: {escape(r['error'])}")


def dynamic_bars_table(bars: dict[str, Any]) -> Table:
    """vfuse against issue 15's bars on the text models (graphs, compile time vs Inductor)."""
    title = "bars: vfuse vs Inductor on the text models (graphs <= Inductor's; compile time warm <= 1x, cold <= 1/3x)"
    table = Table(title=title)
    for h in ("model", "mode", "caches", "graphs\nvfuse / inductor", "compile\nvfuse / inductor"):
        table.add_column(h, justify="left" if h in ("model", "mode", "caches") else "right")
    for b in bars["models"]:
        ratio = b["compile_ratio"]
        graphs = _bar_text(f"{b['graphs'][0]} / {b['graphs'][1]}", b["graphs_ok"])
        compile_ratio = _bar_text("-" if ratio is None else f"{ratio:.2f}x", b["compile_ok"])
        table.add_row(b["model"], b["mode"], b["cache"], graphs, compile_ratio)
    return table
