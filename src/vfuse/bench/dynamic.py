"""`vfuse bench --dynamic`: dynamic shapes, vfuse against Inductor (issue 15's bars).

1. Text models at five sequence lengths (`bench/dynamic_models.py`): graphs compiled, outputs
   against eager, total compile time with cold and warm caches, the first call at a new length.
2. Steady state of the dynamic build against the static build at the same size, for the
   memory-bound workloads and the GPT-2 block: each contender builds the module twice,
   `torch.compile(dynamic=False)` and `dynamic=True`; the dynamic build's first call is at
   another size (the hint: 3/4 of the varied dim, +1), so the timed size runs a program made
   for sizes in general, not for it. All four builds are timed interleaved (bench/timing.py).
3. The first call of the dynamic build at a third size (5/8, +1) after that warm-up: its time
   over the steady call at that size (a compile, or a new size's setup, shows up here); the
   median over that size and the next smaller new ones (`NEW_SIZES`): one wall-clock sample of a
   call was the bar's whole figure, and under load it swung by milliseconds.

Each build compiles a deep copy of the module (Dynamo's cache is per code object). Frozen
workloads compile frozen in both builds (vfuse freeze=True, Inductor freezing). See
docs/benchmarks.md, "Dynamic shapes".
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from rich.console import Console
from torch import Tensor, nn

from vfuse.bench import dynamic_models
from vfuse.bench import workloads as workload_registry
from vfuse.bench.checks import compare
from vfuse.bench.results import MachineInfo
from vfuse.bench.runner import _short_error
from vfuse.bench.timing import TimingConfig, measure
from vfuse.bench.workloads import Workload

SCHEMA = "vfuse-bench-dynamic/1"
COMPILERS = ("vfuse", "inductor")
# Steady part only: Dynamo with the eager backend, the share of dynamic/static that is capture's
# own (its shape guards and SymInt arguments; docs/benchmarks.md).
STEADY_ONLY = ("dynamo",)
STEADY_WORKLOADS = (
    "chain", "transpose_add", "ln_gelu", "layernorm_small", "rms_silu", "softmax", "gelu_residual",
    "dequant_quant", "tiny_graph", "gpt2_block",
)  # fmt: skip
# The dim varied per input (default 0): transpose_add reads x transposed; a block varies T.
_VARIED_DIMS = {"transpose_add": (1, 0), "gpt2_block": (1,)}
HINT_FRACTION, NEW_FRACTION = 3 / 4, 5 / 8
# Issue 15's bars.
MAX_DYNAMIC_RATIO, MAX_NEW_SIZE_EXTRA_S = 1.15, 1e-3
MAX_GRAPHS_VS_INDUCTOR, MAX_WARM_VS_INDUCTOR, MAX_COLD_VS_INDUCTOR = 1.0, 1.0, 1 / 3
_NEW_SIZE_STEADY_CALLS = 5
# New sizes whose first calls are timed (5/8 of the varied dim +1, then 1/64 of it less each); the
# bar takes their median extra.
NEW_SIZES = 3


def resized(name: str, inputs: tuple[Tensor, ...], fraction: float) -> tuple[Tensor, ...]:
    """The inputs cut to `fraction` of their varied dim, plus one (odd sizes: vector tails)."""
    dims = _VARIED_DIMS.get(name, ())
    out = []
    for i, x in enumerate(inputs):
        d = dims[i] if i < len(dims) else 0
        # A copy, not a view: Dynamo guards on a view's base, so a view would recompile at the next size.
        out.append(
            x.narrow(d, 0, min(x.shape[d], int(x.shape[d] * fraction) + 1)).clone(memory_format=torch.contiguous_format)
        )
    return tuple(out)


@dataclass
class Build:
    """One compiled build of a module; counts the graphs its calls compiled."""

    contender: str
    dynamic: bool
    fn: Callable[..., Any]
    backend: Any
    graphs: int = 0

    def call(self, inputs: tuple[Tensor, ...]) -> Any:
        before = self._count()
        out = self.fn(*inputs)
        self.graphs += self._count() - before
        return out

    def _count(self) -> int:
        if self.backend is not None:
            return int(self.backend.stats["graphs"])
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def make_build(contender: str, module: nn.Module, dynamic: bool, frozen: bool, strict: bool) -> Build:
    module = copy.deepcopy(module)
    if contender == "inductor":
        options = {"freezing": True} if frozen else None
        return Build(contender, dynamic, torch.compile(module, dynamic=dynamic, options=options), None)
    if contender == "dynamo":  # capture only: what Dynamo's own guards and calls cost each build
        return Build(contender, dynamic, torch.compile(module, backend="eager", dynamic=dynamic), None)
    import vfuse

    backend = vfuse.backend(strict=strict, freeze=frozen)
    return Build(contender, dynamic, torch.compile(module, backend=backend, dynamic=dynamic), backend)


@dataclass
class SteadyRow:
    """One contender on one workload: static vs dynamic build, then a new size."""

    workload: str
    contender: str
    shape: tuple[int, ...] = ()  # the first input's shape, timed
    hint_shape: tuple[int, ...] = ()  # the dynamic build's first call
    static_s: float | None = None  # median per call
    static_iqr_s: float | None = None
    dynamic_s: float | None = None
    dynamic_iqr_s: float | None = None
    ratio: float | None = None  # dynamic_s / static_s
    static_graphs: int = 0
    dynamic_graphs: int = 0  # after the hint and the timed size
    static_max_abs_err: float | None = None
    dynamic_max_abs_err: float | None = None
    new_shape: tuple[int, ...] = ()
    new_first_s: float | None = None
    new_steady_s: float | None = None
    new_extra_s: float | None = None  # the median of `new_extras_s`
    new_extras_s: list[float] = field(default_factory=list)  # each new size's first call over its steady one
    new_graphs: int = 0  # compiled by the first calls at the new sizes
    new_max_abs_err: float | None = None
    ok: bool = False
    error: str = ""


def _check(row: SteadyRow, w: Workload, expected: Any, got: Any, field: str) -> bool:
    check = compare(expected, got, w.rtol, w.atol)
    setattr(row, field, check.max_abs_err)
    if not check.ok:
        row.error = row.error or f"{field.split('_')[0]}: {check.detail}"
    return check.ok


def _new_size(row: SteadyRow, w: Workload, build: Build, sizes: list[tuple[tuple[Tensor, ...], Any]]) -> bool:
    """At each (inputs, expected) of a size the build has not seen: the first call, then steady
    calls there (collector off); the row's extra is the median over the sizes."""
    ok = True
    for inputs, expected in sizes:
        gc.disable()
        try:
            before = build.graphs
            start = time.perf_counter()
            out = build.call(inputs)
            first = time.perf_counter() - start
            steady = []
            for _ in range(_NEW_SIZE_STEADY_CALLS):
                start = time.perf_counter()
                build.fn(*inputs)
                steady.append(time.perf_counter() - start)
        finally:
            gc.enable()
        row.new_graphs += build.graphs - before
        row.new_extras_s.append(first - statistics.median(steady))
        if row.new_first_s is None:  # the figures of the first new size (`new_shape`)
            row.new_first_s, row.new_steady_s = first, statistics.median(steady)
        ok &= _check(row, w, expected, out, "new_max_abs_err")
    row.new_extra_s = statistics.median(row.new_extras_s)
    return ok


def new_sizes(name: str, inputs: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
    """The inputs at `NEW_SIZES` sizes no earlier call had: 5/8 of the varied dim (+1), then 1/64 less each."""
    return [resized(name, inputs, NEW_FRACTION - k / 64) for k in range(NEW_SIZES)]


def _steady_workload(w: Workload, args: argparse.Namespace, timing: TimingConfig) -> list[SteadyRow]:
    inst = w.build(args.quick)
    hint, news = resized(w.name, inst.inputs, HINT_FRACTION), new_sizes(w.name, inst.inputs)
    with torch.no_grad():
        expected = inst.module(*inst.inputs)
        checked_news = [(new, inst.module(*new)) for new in news]
    rows, fns = [], {}
    for contender in args.steady_contenders:
        row = SteadyRow(w.name, contender, tuple(inst.inputs[0].shape), tuple(hint[0].shape))
        row.new_shape = tuple(news[0][0].shape)
        try:
            with torch.no_grad():
                static, dyn = (make_build(contender, inst.module, d, w.frozen, args.strict) for d in (False, True))
                ok = _check(row, w, expected, static.call(inst.inputs), "static_max_abs_err")
                dyn.call(hint)
                ok &= _check(row, w, expected, dyn.call(inst.inputs), "dynamic_max_abs_err")
            row.static_graphs, row.dynamic_graphs, row.ok = static.graphs, dyn.graphs, ok
            fns[contender] = (row, static, dyn)
        except Exception as exc:  # one contender's failure is a row, not the end of the run
            row.error = _short_error(exc)
        rows.append(row)
    _time_builds(fns, inst.inputs, timing)
    for row, _, dyn in fns.values():
        try:
            with torch.no_grad():
                row.ok &= _new_size(row, w, dyn, checked_news)
        except Exception as exc:
            row.ok, row.error = False, _short_error(exc)
    return rows


def _time_builds(fns: dict[str, tuple[SteadyRow, Build, Build]], inputs: tuple[Tensor, ...], t: TimingConfig) -> None:
    """Every build timed in the same interleaved rounds."""
    calls: dict[str, Callable[[], object]] = {}
    for name, (_, static, dyn) in fns.items():
        calls[f"{name} static"] = lambda f=static.fn: f(*inputs)
        calls[f"{name} dynamic"] = lambda f=dyn.fn: f(*inputs)
    if not calls:
        return
    with torch.no_grad():
        stats = measure(calls, t)
    for name, (row, _, _) in fns.items():
        s, d = stats[f"{name} static"], stats[f"{name} dynamic"]
        row.static_s, row.static_iqr_s, row.dynamic_s, row.dynamic_iqr_s = s.median_s, s.iqr_s, d.median_s, d.iqr_s
        row.ratio = d.median_s / s.median_s


def steady_rows(args: argparse.Namespace, console: Console, timing: TimingConfig) -> list[SteadyRow]:
    rows = []
    for w in workload_registry.select(args.steady_workloads):
        console.print(f"dynamic vs static: {w.name}", style="dim")
        torch._dynamo.reset()
        rows += _steady_workload(w, args, timing)
    return rows


def model_rows(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    rows = []
    for model in args.text_models:
        for contender in args.compilers:
            for mode in args.modes:
                where = "in-process" if args.smoke else "cold and warm processes"
                console.print(f"{model}: {contender}, {mode} ({where})", style="dim")
                if args.smoke:
                    rows.append(dynamic_models.in_process(contender, model, mode, args.quick, args.strict))
                else:
                    rows += dynamic_models.measure(contender, model, mode, args.quick, args.threads, args.strict)
    return rows


def _model_ok(row: dict[str, Any]) -> bool:
    calls = [*row.get("calls", ()), row.get("new_size", {"ok": False})]
    return not row.get("error") and not row.get("eager_graphs") and all(c["ok"] for c in calls)


def bars(models: list[dict[str, Any]], steady: list[SteadyRow]) -> dict[str, Any]:
    """Each bar of issue 15, per model or workload: vfuse's figure, Inductor's, and whether it holds."""
    out: dict[str, Any] = {"models": [], "steady": []}
    by_key = {(r["model"], r["mode"], r["contender"], r["cache"]): r for r in models if not r.get("error")}
    for model, mode, contender, cache in by_key:
        other = by_key.get((model, mode, "inductor", cache))
        if contender != "vfuse" or other is None:
            continue
        v = by_key[(model, mode, contender, cache)]
        limit = MAX_COLD_VS_INDUCTOR if cache == "cold" else MAX_WARM_VS_INDUCTOR
        entry = {"model": model, "mode": mode, "cache": cache, "graphs": [v["graphs"], other["graphs"]]}
        entry["graphs_ok"] = v["graphs"] <= MAX_GRAPHS_VS_INDUCTOR * other["graphs"]
        entry["compile_ratio"] = v["compile_s"] / other["compile_s"] if other["compile_s"] > 0 else None
        entry["compile_ok"] = entry["compile_ratio"] is not None and entry["compile_ratio"] <= limit
        entry["new_size_extra_s"] = v["new_size"]["extra_s"]
        entry["new_size_ok"] = v["new_size"]["extra_s"] <= MAX_NEW_SIZE_EXTRA_S
        out["models"].append(entry)
    capture = {r.workload: r for r in steady if r.contender == "dynamo" and r.ratio is not None}
    for r in steady:
        if r.contender == "vfuse" and r.ratio is not None:
            entry = {"workload": r.workload, "ratio": r.ratio, "ratio_ok": r.ratio <= MAX_DYNAMIC_RATIO}
            if r.workload in capture:  # the per-call time dynamic capture adds by itself
                c = capture[r.workload]
                entry["capture_extra_s"] = c.dynamic_s - c.static_s  # type: ignore[operator]
            extra = r.new_extra_s
            entry |= {"new_size_extra_s": extra, "new_size_ok": extra is not None and extra <= MAX_NEW_SIZE_EXTRA_S}
            out["steady"].append(entry)
    return out


def _resolve(args: argparse.Namespace) -> None:
    """Which models, workloads, compilers and modes this run covers (ValueError on bad names)."""
    contenders = args.contenders or ["eager", *COMPILERS, *STEADY_ONLY]
    unknown = [c for c in contenders if c not in ("eager", *COMPILERS, *STEADY_ONLY)]
    if unknown:
        known = ", ".join(COMPILERS + STEADY_ONLY)
        raise ValueError(f"--dynamic contenders: any of eager, {known}; not {', '.join(unknown)}")
    args.compilers = [c for c in COMPILERS if c in contenders]
    if not args.compilers:
        raise ValueError(f"--dynamic contenders: at least one of {', '.join(COMPILERS)}")
    args.steady_contenders = [*args.compilers, *(c for c in STEADY_ONLY if c in contenders)]
    models = dynamic_models.TEXT_MODELS if args.models is None or args.models == [] else args.models
    wrong = [m for m in models if m not in dynamic_models.TEXT_MODELS]
    if wrong:
        raise ValueError(f"--dynamic models: text models only ({', '.join(dynamic_models.TEXT_MODELS)}); not {wrong}")
    args.text_models = list(models)
    args.steady_workloads = args.workloads if args.workloads is not None else list(STEADY_WORKLOADS)
    workload_registry.select(args.steady_workloads)
    args.modes = ["dynamic"] if args.smoke else list(dynamic_models.MODES)
    args.strict = not args.allow_fallback
    args.quick = args.quick or args.smoke


def _timing(args: argparse.Namespace) -> TimingConfig:
    reps = args.reps if args.reps is not None else (3 if args.quick else 15)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    sample_ms = args.min_sample_ms if args.min_sample_ms is not None else (1.0 if args.quick else 20.0)
    return TimingConfig(warmup, reps, sample_ms / 1e3)


def report(args: argparse.Namespace, models: list[dict[str, Any]], steady: list[SteadyRow]) -> dict[str, Any]:
    config = {
        "dynamic": True, "smoke": args.smoke, "quick": args.quick, "threads": args.threads,
        "compilers": args.compilers, "steady_contenders": args.steady_contenders,
        "models": args.text_models, "modes": args.modes,
        "lengths": list(dynamic_models.lengths(args.quick)[0]), "new_length": dynamic_models.lengths(args.quick)[1],
        "workloads": args.steady_workloads, "hint_fraction": HINT_FRACTION, "new_fraction": NEW_FRACTION,
        "vfuse_strict": args.strict,
    }  # fmt: skip
    ok = all(_model_ok(r) for r in models) and all(r.ok for r in steady)
    return {
        "schema": SCHEMA,
        "config": config,
        "machine": asdict(MachineInfo.probe()),
        "ok": ok,
        "models": models,
        "steady": [asdict(r) for r in steady],
        "bars": bars(models, steady),
    }


def main(args: argparse.Namespace) -> int:
    """`vfuse bench --dynamic`: 0 when every output matched eager, 1 otherwise, 2 on bad usage."""
    from vfuse.bench.render import print_dynamic

    try:
        _resolve(args)
    except ValueError as e:
        print(f"vfuse bench: {e}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 170)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        models = model_rows(args, console)
        steady = steady_rows(args, console, _timing(args))
        doc = report(args, models, steady)
    finally:
        torch.set_num_threads(threads_before)
    print_dynamic(console, doc)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    return 0 if doc["ok"] else 1
