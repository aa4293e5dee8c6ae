"""`vfuse bench` / `python -m vfuse.bench`: argument handling and the order of the phases.

Phases run one after another, each with its own progress bar on stderr: the in-process run,
the optional `--no-mmap` rerun in a child process, the optional compile-time probes. Tables
go to stdout after all phases, so piping stdout captures only the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vfuse.bench import contenders as contender_registry
from vfuse.bench import models as model_registry
from vfuse.bench import workloads as workload_registry
from vfuse.bench.checks import FLOAT_RTOL
from vfuse.bench.compile_times import measure_compile_time
from vfuse.bench.contenders import REFERENCE
from vfuse.bench.render import print_compile_times, print_run, write_png
from vfuse.bench.results import SCHEMA, BenchReport, CompileTime, RunResult
from vfuse.bench.runner import run_all
from vfuse.bench.timing import TimingConfig

# mmap_max=0 alone is not enough: glibc then returns a freed top-of-heap chunk to the OS
# (trim) and the next allocation faults its pages in again, so trimming is turned off too.
NO_MMAP_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
DEFAULT_LABEL = "default malloc"
NO_MMAP_LABEL = "no mmap (GLIBC_TUNABLES)"


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vfuse bench", description="Benchmark eager vs Inductor vs vfuse on CPU.")
    p.add_argument("--workloads", type=_csv, help=f"comma list (default all): {', '.join(workload_registry.WORKLOADS)}")
    p.add_argument(
        "--models",
        nargs="?",
        const=[],
        type=_csv,
        help=f"real models instead of the workloads (optionally a comma list): {', '.join(model_registry.MODELS)}",
    )
    p.add_argument("--contenders", type=_csv, help="comma list (default eager,inductor,vfuse; also: dynamo)")
    p.add_argument("--quick", action="store_true", help="small sizes and few reps (tests, CI)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads for everyone")
    p.add_argument("--reps", type=int, help="timed rounds (default 21, quick 5)")
    p.add_argument("--warmup", type=int, help="untimed calls per contender (default 3, quick 1)")
    p.add_argument("--min-sample-ms", type=float, help="batch calls until a sample lasts this long (default 20)")
    p.add_argument("--json", type=Path, help="write all raw figures and machine info here")
    p.add_argument("--png", type=Path, help="write a bar chart of speedups here (needs matplotlib)")
    p.add_argument("--no-mmap", action="store_true", help="also rerun in a child with malloc's mmap disabled")
    p.add_argument(
        "--compile-times",
        action="store_true",
        help="cold, warm and warm-process compile times, each in a fresh process (slow)",
    )
    p.add_argument("--compile-workload", default="ln_gelu", help="workload for --compile-times (default ln_gelu)")
    p.add_argument("--allow-fallback", action="store_true", help="let vfuse fall back to eager (VFUSE_STRICT decides)")
    p.add_argument("--list", action="store_true", help="list workloads and contenders, then exit")
    # The GPU benchmark (bench/device.py): its own workloads, contenders and JSON schema.
    p.add_argument("--device", choices=("cpu", "cuda"), help="run the device benchmark (cuda; cpu: its smoke run)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (--device: Triton's interpreter)")
    p.add_argument("--budget-s", type=float, default=280.0, help="with --device: skip what is left after this")
    # Training steps (bench/train.py): its own workloads (--workloads picks among them), --models in train mode.
    p.add_argument("--train", action="store_true", help="time training steps (forward, backward, AdamW) instead")
    # Dynamic shapes (bench/dynamic.py): text models at 5 lengths, dynamic vs static builds; --smoke: tiny, fast.
    p.add_argument("--dynamic", action="store_true", help="dynamic shapes vs Inductor: compiles, dynamic/static time")
    # Internal: the --no-mmap child runs with these and hands its run back as JSON.
    p.add_argument("--child-json", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--label", default=DEFAULT_LABEL, help=argparse.SUPPRESS)
    return p


def _timing(args: argparse.Namespace) -> TimingConfig:
    reps = args.reps if args.reps is not None else (5 if args.quick else 21)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    sample_ms = args.min_sample_ms if args.min_sample_ms is not None else (1.0 if args.quick else 20.0)
    return TimingConfig(warmup=warmup, reps=reps, min_sample_s=sample_ms / 1e3)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def _selected(args: argparse.Namespace) -> list[workload_registry.Workload]:
    """--workloads (all by default), or with --models the models, after any --workloads named."""
    if args.models is None:
        return workload_registry.select(args.workloads)
    named = workload_registry.select(args.workloads) if args.workloads else []
    return named + model_registry.select(args.models)


def _in_process_run(args: argparse.Namespace) -> RunResult:
    workloads = _selected(args)
    contenders = contender_registry.select(args.contenders, args.allow_fallback)
    with _progress() as progress:
        task = progress.add_task(args.label, total=len(workloads))

        def status(text: str) -> None:
            progress.update(task, description=f"({args.label}) {text}")

        def advance() -> None:
            progress.advance(task)

        return run_all(args.label, workloads, contenders, args.quick, _timing(args), status, advance)


def _child_argv(args: argparse.Namespace, json_path: Path) -> list[str]:
    """The same benchmark, minus the parent-only phases and outputs."""
    timing = _timing(args)
    argv = ["--threads", str(args.threads), "--reps", str(timing.reps), "--warmup", str(timing.warmup)]
    argv += [
        "--min-sample-ms",
        str(timing.min_sample_s * 1e3),
        "--child-json",
        str(json_path),
        "--label",
        NO_MMAP_LABEL,
    ]
    if args.workloads:
        argv += ["--workloads", ",".join(args.workloads)]
    if args.contenders:
        argv += ["--contenders", ",".join(args.contenders)]
    if args.models is not None:
        argv += ["--models", ",".join(args.models)] if args.models else ["--models"]
    argv += ["--quick"] if args.quick else []
    argv += ["--allow-fallback"] if args.allow_fallback else []
    return argv


def no_mmap_env() -> dict[str, str]:
    current = os.environ.get("GLIBC_TUNABLES")
    return {**os.environ, "GLIBC_TUNABLES": f"{current}:{NO_MMAP_TUNABLES}" if current else NO_MMAP_TUNABLES}


def _no_mmap_run(args: argparse.Namespace) -> RunResult | str:
    """Rerun in a child process (glibc reads its tunables only at start); a str says why not."""
    with tempfile.TemporaryDirectory(prefix="vfuse-bench-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "vfuse.bench", *_child_argv(args, out)]
        # The child draws its own progress bar on our stderr; its exit code only reports
        # mismatches, which the parent reads from the JSON, so only a missing file is fatal.
        subprocess.run(cmd, env=no_mmap_env(), check=False)
        try:
            return RunResult.from_dict(json.loads(out.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Lose the child's run, not the parent's: its tables and JSON are still worth having.
            return f"--no-mmap child gave no usable results ({type(exc).__name__}: {exc}): {' '.join(cmd)}"


def _compile_times(args: argparse.Namespace) -> tuple[CompileTime, ...]:
    names = [c.name for c in contender_registry.select(args.contenders) if c.name != REFERENCE]
    # With --models every model is probed; otherwise the one --compile-workload.
    targets = [m.name for m in model_registry.select(args.models)] if args.models is not None else []
    targets = targets or [model_registry.lookup(args.compile_workload).name]
    rows = []
    with _progress() as progress:
        task = progress.add_task("compile times", total=len(names) * len(targets))
        for target in targets:
            for name in names:
                progress.update(task, description=f"compile times: {name} on {target} (cold, warm, 2nd graph)")
                rows.append(measure_compile_time(name, target, args.quick, args.threads, args.allow_fallback))
                progress.advance(task)
    return tuple(rows)


def _config(args: argparse.Namespace) -> dict[str, object]:
    timing = _timing(args)
    return {
        "quick": args.quick,
        "threads": args.threads,
        "workloads": [w.name for w in _selected(args)],
        "contenders": [c.name for c in contender_registry.select(args.contenders)],
        "reps": timing.reps,
        "warmup": timing.warmup,
        "min_sample_s": timing.min_sample_s,
        "no_mmap_tunables": NO_MMAP_TUNABLES if args.no_mmap else None,
        "vfuse_strict": None if args.allow_fallback else True,
    }


def _write_outputs(args: argparse.Namespace, report: BenchReport, console: Console) -> None:
    if args.json:
        args.json.write_text(json.dumps(report.to_json_dict(), indent=1) + "\n")
        console.print(f"wrote {args.json}")
    if args.png:
        write_png(report.runs, args.png)
        console.print(f"wrote {args.png}")


def _run(args: argparse.Namespace) -> int:
    runs = [_in_process_run(args)]
    if args.child_json:
        args.child_json.write_text(json.dumps(asdict(runs[0])))
        return 0 if runs[0].ok else 1
    child = _no_mmap_run(args) if args.no_mmap else None
    errors = (child,) if isinstance(child, str) else ()
    runs += [child] if isinstance(child, RunResult) else []
    compile_rows = _compile_times(args) if args.compile_times else None
    ok = all(r.ok for r in runs) and all(c.error is None for c in compile_rows or ()) and not errors
    report = BenchReport(SCHEMA, _config(args), tuple(runs), compile_rows, ok, errors)
    # Piped output has no terminal width; 80 columns would wrap every cell of the table.
    console = Console(width=None if sys.stdout.isatty() else 150)
    for run in runs:
        print_run(console, run)
    if compile_rows is not None:
        print_compile_times(console, compile_rows)
    for error in errors:
        console.print(f"[bold red]ERROR[/] {escape(error)}")
    _write_outputs(args, report, console)
    if not ok:
        console.print("[bold red]FAILED: some contender mismatched eager or errored (see above)[/]")
    return 0 if ok else 1


def _list(console: Console) -> None:
    for w in [*workload_registry.WORKLOADS.values(), *model_registry.MODELS.values()]:
        notes = f" [rtol {w.rtol:g}{', frozen' if w.frozen else ''}]" if w.frozen or w.rtol != FLOAT_RTOL else ""
        console.print(f"workload   {w.name:<18} {w.description}{notes}", markup=False, soft_wrap=True)
    for c in contender_registry.CONTENDERS.values():
        console.print(f"contender  {c.name:<18} {c.description}", markup=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 when every contender matched eager, 1 otherwise, 2 on bad usage."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on errors; we return instead
        return int(exc.code or 0)
    if args.device is not None:
        from vfuse.bench import device

        return device.main(args)
    if args.train:
        from vfuse.bench import train

        return train.main(args)
    if args.dynamic:
        from vfuse.bench import dynamic

        return dynamic.main(args)
    if args.list:
        _list(Console())
        return 0
    try:
        _selected(args)
        contender_registry.select(args.contenders)
        model_registry.lookup(args.compile_workload)
    except ValueError as exc:
        print(f"vfuse bench: {exc}", file=sys.stderr)
        return 2
    # Process-wide, so put back afterwards: main() also runs inside test sessions.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads_before)
