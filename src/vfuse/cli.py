"""The `vfuse` command: `vfuse explain module.py:factory`, `vfuse profile module.py:factory`, `vfuse bench ...`.

User mistakes (a missing file, a factory that returns the wrong thing, an unknown target) end
with one line on stderr and exit code 2; `--traceback` shows the full error for debugging.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport

EXPLAIN_HELP = """\
Capture a model, plan its fusion for a target, and print what is fused and why.

SPEC names a factory: `path/to/module.py:factory` or `package.module:factory`.
The factory is called with no arguments and must return a pair
    (model_or_fn, example_inputs)
where model_or_fn is a torch.nn.Module or a function of tensors, and example_inputs is a
tuple of the positional arguments to call it with, e.g.

    def factory():
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
        return model, (torch.randn(8, 64),)

The report shows the kernels and torch calls that vfuse.compile would run with the same
options (--freeze as freeze=True), with the cost model's predictions; nothing is built or run.
--summary prints the totals and one line per kernel; --json prints everything as JSON."""


PROFILE_HELP = """\
Compile a model with vfuse (as vfuse.compile does), run it on the factory's example inputs, and
print one row per generated kernel and torch step: the cost model's predicted time, the measured
time (median of --reps runs, each kernel clocked inside its native call) and their ratio.
SPEC is as for `vfuse explain`."""


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vfuse", description="vfuse: a vertical-fusion compiler for PyTorch.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ex = sub.add_parser(
        "explain",
        help="report what vfuse would fuse for a model, and why",
        description=EXPLAIN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument("spec", metavar="SPEC", help="module.py:factory (see above)")
    ex.add_argument("--target", default="cpu", help="hardware to plan for: cpu, a100, h100, h200 (default: cpu)")
    ex.add_argument(
        "--freeze", action="store_true", help="compile parameters in as constants (freeze=True: Conv-BN folding)"
    )
    mode = ex.add_mutually_exclusive_group()
    mode.add_argument("--summary", action="store_true", help="print the totals and one line per kernel only")
    mode.add_argument("--json", action="store_true", help="print the whole report as JSON instead of tables")
    ex.add_argument("--html", type=Path, metavar="PATH", help="also write the interactive HTML report here")
    ex.add_argument("--dot", type=Path, metavar="PATH", help="also write the Graphviz graph here")
    ex.add_argument("--width", type=int, default=120, help="width of the printed tables (default: 120)")
    ex.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    pr = sub.add_parser(
        "profile",
        help="compile a model, time each of its kernels and compare with the cost model",
        description=PROFILE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pr.add_argument("spec", metavar="SPEC", help="module.py:factory (as for explain)")
    pr.add_argument("--reps", type=int, default=20, help="timed runs per kernel, after 2 warm-up runs (default: 20)")
    pr.add_argument("--freeze", action="store_true", help="compile parameters in as constants (freeze=True)")
    pr.add_argument("--isa", default="auto", help="instruction-set tier to build for (default: auto)")
    pr.add_argument(
        "--threads",
        type=int,
        help="run the kernels on this many threads and predict for as many cores (loaded machine: 1)",
    )
    pr.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    pr.add_argument("--html", type=Path, metavar="PATH", help="also write the HTML report, measured times included")
    pr.add_argument("--width", type=int, default=120, help="width of the printed table (default: 120)")
    pr.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    ca = sub.add_parser(
        "calibrate",
        help="time vfuse's own kernels on this machine and cache the cost model's rates (per tier)",
        description="Time vfuse's kernels on one thread (streaming add in L2, L3 and DRAM, transcendental "
        "chain, GEMM, tiny kernels) and cache the rates for the tier (targets/calibrate.py).",
    )
    ca.add_argument("--isa", default="auto", help="instruction-set tier to calibrate (default: auto)")
    ca.add_argument("--reps", type=int, default=30, help="runs per kernel, the fastest kept (default: 30)")
    ca.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    # Registered so that it is listed in --help; main() forwards its arguments untouched.
    sub.add_parser("bench", help="run the benchmarks (vfuse bench --help for their options)", add_help=False)
    return parser


def version_text() -> str:
    """`vfuse 0.1.0 (torch 2.13.0+cpu, Python 3.11.7)`: torch's version read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    from vfuse import __version__

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"vfuse {__version__} (torch {torch_version}, Python {platform.python_version()})"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["bench"]:
        # The benchmark harness owns its own options; parsing them here would need to mirror them.
        from vfuse import bench

        return int(bench.main(args[1:]) or 0)
    ns = build_parser().parse_args(args)
    try:
        return {"profile": run_profile, "calibrate": run_calibrate}.get(ns.command, run_explain)(ns)
    except UsageError as e:
        if ns.traceback:
            raise
        print(f"vfuse {ns.command}: error: {e}", file=sys.stderr)
        return 2


def run_explain(ns: argparse.Namespace) -> int:
    model, inputs = call_factory(load_factory(ns.spec), ns.spec)
    # Imported only now (it pulls in torch and the planner) so that usage errors come back fast;
    # looked up on its module so that tests can stand in for it.
    from vfuse.report.explain import explain
    from vfuse.targets import PRESETS

    if ns.target.lower() not in {"cpu", *PRESETS}:
        raise UsageError(f"unknown target {ns.target!r}; known: cpu, {', '.join(sorted(PRESETS))}")
    try:
        report = explain(model, *inputs, target=ns.target, freeze=ns.freeze)
    except Exception as e:
        if ns.traceback:
            raise
        # Capture and planning errors are not usage errors, but a wall of frames does not help
        # a user either: say what failed and how to see more.
        print(f"vfuse explain: failed: {type(e).__name__}: {_one_line(e)} (rerun with --traceback)", file=sys.stderr)
        return 1
    if ns.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        _print_report(report, ns.width, ns.summary)
    if ns.html is not None:
        _write(ns.html, report.to_html())
    if ns.dot is not None:
        _write(ns.dot, report.to_dot())
    return 0


def run_profile(ns: argparse.Namespace) -> int:
    if ns.reps < 1:
        raise UsageError(f"--reps must be at least 1, got {ns.reps}")
    model, inputs = call_factory(load_factory(ns.spec), ns.spec)
    from vfuse.report.explain import explain
    from vfuse.report.text import profile_data, profile_table

    try:
        report = explain(model, *inputs, profile=ns.reps, profile_threads=ns.threads, freeze=ns.freeze, isa=ns.isa)
    except Exception as e:
        if ns.traceback:
            raise
        print(f"vfuse profile: failed: {type(e).__name__}: {_one_line(e)} (rerun with --traceback)", file=sys.stderr)
        return 1
    if ns.json:
        sys.stdout.write(json.dumps(profile_data(report), indent=1) + "\n")
    else:
        from rich.console import Console

        Console(width=ns.width, color_system="auto" if sys.stdout.isatty() else None).print(profile_table(report))
    if ns.html is not None:
        _write(ns.html, report.to_html())
    return 0


def run_calibrate(ns: argparse.Namespace) -> int:
    if ns.reps < 1:
        raise UsageError(f"--reps must be at least 1, got {ns.reps}")
    from vfuse.context import Options
    from vfuse.entry.calibrate import calibrate

    cal, bad, path = calibrate(ns.isa, Options.from_env().cache_dir, ns.reps)
    values = [(f.name, getattr(cal, f.name)) for f in dataclasses.fields(cal) if f.name != "op_rates"]
    for name, value in values + [(f"op_rates.{op}", rate) for op, rate in cal.op_rates]:
        print(f"{name:18s} {value:.4g}")
    for name in bad:
        print(f"{name:18s} implausible: the torch-measured figure kept")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _print_report(report: FusionReport, width: int, summary: bool) -> None:
    if sys.stdout.isatty():
        from rich.console import Console

        from vfuse.report.text import renderables

        console = Console(width=width)
        for part in renderables(report, summary):
            console.print(part)
    else:
        sys.stdout.write(report.to_text(width=width, summary=summary))


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e
    print(f"wrote {path}", file=sys.stderr)


def load_factory(spec: str) -> Callable[[], Any]:
    """Resolve `file.py:name` or `package.module:name` to the callable it names."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(f"expected SPEC as module.py:factory, got {spec!r}")
    module = _import(where)
    factory = getattr(module, name, None)
    if factory is None:
        raise UsageError(f"{where} has no attribute {name!r}")
    if not callable(factory):
        raise UsageError(f"{where}:{name} is a {type(factory).__name__}, not a callable factory")
    return factory


def _import(where: str) -> Any:
    path = Path(where)
    is_file = where.endswith(".py") or path.exists()
    if is_file and not path.is_file():
        raise UsageError(f"no such file: {where}")
    try:
        if not is_file:
            return importlib.import_module(where)
        spec = importlib.util.spec_from_file_location(f"_vfuse_factory_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot import {where}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except UsageError:
        raise
    except ModuleNotFoundError as e:
        if e.name == where:
            raise UsageError(f"no such module: {where}") from e
        raise UsageError(f"importing {where} failed: {type(e).__name__}: {_one_line(e)}") from e
    except Exception as e:
        raise UsageError(f"importing {where} failed: {type(e).__name__}: {_one_line(e)}") from e


def call_factory(factory: Callable[[], Any], spec: str) -> tuple[Any, tuple[Any, ...]]:
    """Call the factory and check it returned (model_or_fn, tuple of example inputs)."""
    try:
        result = factory()
    except Exception as e:
        raise UsageError(f"{spec}() raised {type(e).__name__}: {_one_line(e)}") from e
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UsageError(f"{spec}() must return (model_or_fn, example_inputs), got {_describe(result)}")
    model, inputs = result
    if not callable(model):
        raise UsageError(f"{spec}() returned a {type(model).__name__} as the model; expected a module or function")
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, tuple):
        raise UsageError(f"{spec}() must return example_inputs as a tuple, got {_describe(inputs)}")
    return model, inputs


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


if __name__ == "__main__":
    sys.exit(main())
