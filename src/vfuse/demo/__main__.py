"""`make demo` / `python -m vfuse.demo`: compile a built-in transformer block with vfuse and show
the result first (time against eager and Inductor, kernels, bytes), then a short fusion report,
then where to read more (every stage of this compile, the full report as HTML, the docs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

import vfuse
from vfuse.demo.model import example
from vfuse.entry.observe import CompileStats
from vfuse.report.text import kernel_table, summary_table
from vfuse.report.units import fmt_bytes, fmt_ratio


def _compiled(console: Console, name: str, make: Callable[[], Any], x: torch.Tensor) -> tuple[Any, Any]:
    """`make()`, its first call (which compiles) timed and announced; returns (callable, output)."""
    start = time.perf_counter()
    with console.status(f"compiling with {name} ..."):
        fn = make()
        out = fn(x)
    console.print(f"compiled with {name} in {time.perf_counter() - start:.1f} s")
    return fn, out


def _speed_table(contenders: dict[str, Callable[[], object]], reps: int) -> Table:
    from vfuse.bench.timing import TimingConfig, measure

    stats = measure(contenders, TimingConfig(3, reps, 0.02))
    table = Table(title=f"median of {reps} interleaved rounds, {torch.get_num_threads()} threads", title_justify="left")
    for col in ("", "median ms", "vs eager", "vs Inductor"):
        table.add_column(col, justify="right" if col else "left")
    eager, inductor = stats["eager"].median_s, stats.get("Inductor")
    for name, s in stats.items():
        against = f"{inductor.median_s / s.median_s:.2f}x" if inductor else "not run"
        table.add_row(name, f"{s.median_s * 1e3:.3f}", f"{eager / s.median_s:.2f}x", against)
    return table


def _result(console: Console, stats: CompileStats, report: Any, error: float, ok: bool) -> None:
    console.print(f"check against eager: max |vfuse - eager| = {error:.2e} -> {'OK' if ok else 'MISMATCH'}")
    console.print(f"what runs: {stats}")
    if stats.kernels != report.num_kernels:
        console.print(
            f"(the plan below has {report.num_kernels} kernel groups; code generation runs them as "
            f"{stats.kernels} native kernels)"
        )
    console.print(
        f"DRAM traffic (planner's estimate): {fmt_bytes(report.bytes_unfused)} with one kernel per op -> "
        f"{fmt_bytes(report.bytes_fused)} fused ({fmt_ratio(report.bytes_unfused, report.bytes_fused)} less); "
        f"lower bound {fmt_bytes(report.bytes_lower_bound)}"
    )


def _read_more(console: Console, out: Path, report: Any) -> None:
    report.to_html(out / "report.html")
    console.print(Rule("read more"))
    lines = [
        f"every stage of this compile (captured graph, IR, plan, program, C++): {out}/, listed in index.txt",
        f"the whole report, every fusion decision with its reason: {out / 'report.html'}",
        "this model's report on the command line: vfuse explain vfuse.demo.model:factory",
        "the same for your own model: vfuse explain path/to/module.py:factory --html out.html",
        "how vfuse works: docs/architecture.md; reading a report: docs/report.md; measurements: docs/benchmarks.md",
    ]
    for line in lines:
        console.print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vfuse.demo", description=__doc__)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (its compile takes a while)")
    parser.add_argument("--reps", type=int, default=15, help="timing rounds (default 15)")
    parser.add_argument("--out", type=Path, help="folder for the dumps and the HTML report (default: a new temp dir)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="vfuse-demo-"))
    console = Console(width=120, markup=False)  # shapes and op names contain brackets
    model, x = example()
    console.print(Rule(f"vfuse demo: a GPT-2-style transformer block, x = float32{list(x.shape)}, inference"))
    with torch.no_grad():
        backend = vfuse.backend(dump_dir=out, strict=True)
        compiled, got = _compiled(console, "vfuse", lambda: torch.compile(model, backend=backend), x)
        expected = model(x)
        contenders = {"eager": model, "vfuse": compiled}
        if not args.no_inductor:
            contenders["Inductor"], _ = _compiled(console, "Inductor", lambda: torch.compile(model), x)
        table = _speed_table({k: (lambda f=f: f(x)) for k, f in contenders.items()}, args.reps)
    error = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    report = vfuse.explain(model, x)
    console.print(Rule("result"))
    console.print(table)
    _result(console, CompileStats.of(backend.compiled, len(backend.eager_fallbacks), backend.reused), report, error, ok)
    console.print(Rule("what vfuse fused (the planner's report)"))
    console.print(summary_table(report))
    console.print(kernel_table(report))
    _read_more(console, out, report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
