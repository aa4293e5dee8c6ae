"""`vfuse bench --dynamic`, part 1: text models called at several sequence lengths.

One probe = one contender (vfuse or Inductor) compiling one model (`bench/models.py`, built
without freezing: vfuse compiles graphs with symbolic sizes unfrozen) under one capture mode:
`dynamic` (`torch.compile(dynamic=True)`) or `auto` (the default: Dynamo's automatic dynamic,
static at the first size, a dim made dynamic when a second size arrives). The probe calls the
model at each length in turn (first calls: what compiling costs), checks every output against
eager, times a few steady calls per length, then calls one more, new length (after warm-up:
what a size never seen costs). It counts the graphs compiled: vfuse's `backend.stats["graphs"]`
(every CompiledGraph, the per-shape ones too) and Dynamo's captured graphs
(`counters["stats"]["unique_graphs"]`), which for Inductor are its compiled graphs (inference:
one per Dynamo graph, every size inside Inductor's kernels).

Cold and warm compile times need fresh processes (caches in memory lie), so the parent runs
each probe as a child (`python -m vfuse.bench.dynamic_models ...`) on cache directories of
its own (VFUSE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TMPDIR: `compile_times.cache_env`): cold on
empty ones, warm on the ones cold filled. `--smoke` runs the probe in-process instead (cache "in-process").
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from vfuse.bench import models as model_registry
from vfuse.bench.checks import compare
from vfuse.bench.compile_times import _preimport, cache_env, run_probe

TEXT_MODELS = ("hf_gpt2", "hf_llama", "hf_bert")
MODES = ("dynamic", "auto")
# Lengths avoid 0/1 (Dynamo specializes them) and the models' head and hidden widths (64, 256:
# duck sizing could tie a length to them). The new length is called after the five.
LENGTHS, NEW_LENGTH = (37, 50, 91, 113, 128), 77
Q_LENGTHS, Q_NEW_LENGTH = (5, 9, 13, 16, 11), 7
_STEADY_CALLS = 3
_PROBE_TIMEOUT_S = 1800


def lengths(quick: bool) -> tuple[tuple[int, ...], int]:
    return (Q_LENGTHS, Q_NEW_LENGTH) if quick else (LENGTHS, NEW_LENGTH)


def _compiled(contender: str, module: torch.nn.Module, mode: str, strict: bool) -> tuple[Callable, Any]:
    dynamic = True if mode == "dynamic" else None
    if contender == "inductor":
        return torch.compile(module, dynamic=dynamic), None
    import vfuse

    backend = vfuse.backend(strict=strict)
    return torch.compile(module, backend=backend, dynamic=dynamic), backend


def _tokens(batch: int, length: int) -> Tensor:
    gen = torch.Generator().manual_seed(length)
    return torch.randint(0, model_registry.VOCAB, (batch, length), generator=gen)


def _graphs(backend: Any) -> tuple[int, int]:
    """(graphs the backend compiled, graphs Dynamo captured) so far."""
    dynamo = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return (backend.stats["graphs"] if backend is not None else dynamo), dynamo


def _call(fn: Callable, x: Tensor, reference: torch.nn.Module, rtol: float, atol: float) -> dict[str, Any]:
    """First call at this length (timed, collector off), its check, and the steady calls after."""
    gc.disable()
    try:
        start = time.perf_counter()
        out = fn(x)
        first = time.perf_counter() - start
        steady = []
        for _ in range(_STEADY_CALLS):
            start = time.perf_counter()
            fn(x)
            steady.append(time.perf_counter() - start)
    finally:
        gc.enable()
    check = compare(reference(x), out, rtol, atol)
    return {
        "length": x.shape[1],
        "first_call_s": first,
        "steady_s": statistics.median(steady),
        "max_abs_err": check.max_abs_err,
        "ok": check.ok,
    }


def probe(contender: str, model: str, mode: str, quick: bool, strict: bool = True) -> dict[str, Any]:
    """Compile and call `model` at every length; what each call cost and what was compiled."""
    workload = model_registry.MODELS[model]
    module = workload.build(quick).module
    batch = model_registry.Q_BATCH if quick else model_registry.BATCH
    sizes, new_length = lengths(quick)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    fn, backend = _compiled(contender, module, mode, strict)
    calls = []
    with torch.no_grad():
        for n in sizes:
            calls.append(_call(fn, _tokens(batch, n), module, workload.rtol, workload.atol))
            calls[-1]["graphs_so_far"] = _graphs(backend)[0]  # which length compiled
        graphs, dynamo_graphs = _graphs(backend)
        new = _call(fn, _tokens(batch, new_length), module, workload.rtol, workload.atol)
        new_graphs = _graphs(backend)[0] - graphs
    eager_graphs = backend.stats["eager_graphs"] if backend is not None else 0
    return {
        "contender": contender,
        "model": model,
        "mode": mode,
        "calls": calls,
        "graphs": graphs,
        "dynamo_graphs": dynamo_graphs,
        "eager_graphs": eager_graphs,
        "compile_s": sum(c["first_call_s"] - c["steady_s"] for c in calls),
        "new_size": new | {"graphs_compiled": new_graphs, "extra_s": new["first_call_s"] - new["steady_s"]},
    }


def _run_child(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    return run_probe("vfuse.bench.dynamic_models", argv, env, _PROBE_TIMEOUT_S)


def measure(contender: str, model: str, mode: str, quick: bool, threads: int, strict: bool) -> list[dict[str, Any]]:
    """Cold and warm probes, each a fresh process, on cache directories of their own."""
    argv = [contender, model, mode, "--threads", str(threads)]
    argv += ["--quick"] if quick else []
    argv += [] if strict else ["--allow-fallback"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vfuse-bench-dyn-") as tmp:
        env = cache_env(tmp)
        for cache in ("cold", "warm"):
            try:
                rows.append(_run_child(argv, env) | {"cache": cache})
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                rows.append(failed(contender, model, mode, cache, f"{type(exc).__name__}: {exc}"))
    return rows


def failed(contender: str, model: str, mode: str, cache: str, error: str) -> dict[str, Any]:
    return {"contender": contender, "model": model, "mode": mode, "cache": cache, "error": error}


def in_process(contender: str, model: str, mode: str, quick: bool, strict: bool) -> dict[str, Any]:
    try:
        return probe(contender, model, mode, quick, strict) | {"cache": "in-process"}
    except Exception as exc:  # one probe's failure is a row, not the end of the run
        return failed(contender, model, mode, "in-process", f"{type(exc).__name__}: {exc}".splitlines()[0])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="dynamic-shape probe (run by vfuse bench --dynamic)")
    parser.add_argument("contender", choices=("vfuse", "inductor"))
    parser.add_argument("model", choices=TEXT_MODELS)
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--allow-fallback", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    _preimport(args.contender)  # import time is no compile time
    print(json.dumps(probe(args.contender, args.model, args.mode, args.quick, not args.allow_fallback)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
