"""Where a first (compiling) call spends its time: one contender, one model, one process.

    python benchmarks/compile_profile.py vfuse hf_gpt2 [--other before] [--prof out.prof]
    python benchmarks/compile_profile.py vfuse hf_bert --dynamic

Runs the same probe as `vfuse bench --compile-times` (bench/compile_times.py: the same
pre-imports, `--other before` = the warm-process case) or, with --dynamic, the first length of
`vfuse bench --dynamic` (bench/dynamic_models.py), and prints one JSON line: the first call,
the time inside the backend, the modules imported during the first call (count, time, the
slowest top-level packages), the C++ compiler runs (count, seconds, source bytes) and, from a
cProfile of the first call, the slowest vfuse functions (cumulative). The caches are whatever
VFUSE_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR hold: point them at empty directories for a cold run.
cProfile inflates Python-heavy parts (Dynamo tracing) about 1.5x; compare runs with each other.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections import Counter
from typing import Any

import torch

from vfuse.bench import compile_times, dynamic_models
from vfuse.bench.contenders import select
from vfuse.bench.models import BATCH, MODELS, Q_BATCH
from vfuse.codegen.cpp import toolchain


class _Imports:
    """Seconds each top-level package took to import while open (outermost imports only)."""

    def __init__(self) -> None:
        self.by_package: Counter[str] = Counter()
        self.count = 0
        self._depth = 0

    def __enter__(self) -> _Imports:
        import builtins

        self._original = builtins.__import__

        def timed(name: str, *args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return self._original(name, *args, **kwargs)
            self._depth += 1
            known, start = len(sys.modules), time.perf_counter()
            try:
                return self._original(name, *args, **kwargs)
            finally:
                self._depth -= 1
                if len(sys.modules) > known:  # something was loaded, not just looked up
                    self.count += len(sys.modules) - known
                    self.by_package[_caller_package() + ":" + name] += time.perf_counter() - start

        builtins.__import__ = timed
        return self

    def __exit__(self, *exc: object) -> None:
        import builtins

        builtins.__import__ = self._original


def _caller_package() -> str:
    """The package of the module whose import statement ran (two frames up: timed, caller)."""
    return str(sys._getframe(2).f_globals.get("__name__", "?"))


class _Compiler:
    """C++ compiler runs (vfuse's toolchain._compile) while open."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, int]] = []

    def __enter__(self) -> _Compiler:

        self._module, self._original = toolchain, toolchain._compile

        def timed(source: str, *args: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._original(source, *args)
            finally:
                self.runs.append((time.perf_counter() - start, len(source)))

        toolchain._compile = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self._module._compile = self._original


def _top_vfuse(prof: cProfile.Profile, n: int) -> list[tuple[str, float]]:
    stats = pstats.Stats(prof)
    rows = [
        (f"{file.split('/src/')[-1]}:{line}({fn})", round(entry[3], 3))
        for (file, line, fn), entry in stats.stats.items()  # type: ignore[attr-defined]
        if "/src/vfuse/" in file
    ]
    return sorted(rows, key=lambda r: -r[1])[:n]


def _first_call(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """The compiled callable and its inputs, built before the clock."""
    if args.dynamic:
        module = MODELS[args.model].build(args.quick).module
        fn, _ = dynamic_models._compiled(args.contender, module, "dynamic", True)
        batch = Q_BATCH if args.quick else BATCH
        length = dynamic_models.lengths(args.quick)[0][0]
        return fn, (dynamic_models._tokens(batch, length),)
    instance = MODELS[args.model].build(args.quick)
    (chosen,) = [c for c in select([args.contender], False) if c.name == args.contender]
    if args.other == "before":
        compile_times._compile_other(chosen)
    return chosen.prepare_for(MODELS[args.model].frozen)(instance.module).fn, instance.inputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender", choices=("vfuse", "inductor"))
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True), first length")
    parser.add_argument("--other", choices=("before",), help="warm process: compile another function first")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prof", help="also write the first call's cProfile here")
    parser.add_argument("--top", type=int, default=0, help="print the N slowest vfuse functions (profiles)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    compile_times._preimport(args.contender)
    torch._dynamo.reset()
    with torch.no_grad(), compile_times._time_backend(args.contender) as watch:
        fn, inputs = _first_call(args)
        before = watch.total_s if watch else 0.0
        prof = cProfile.Profile() if args.prof or args.top else None
        with _Imports() as imports, _Compiler() as cxx:
            start = time.perf_counter()
            if prof is not None:
                prof.enable()
            fn(*inputs)
            if prof is not None:
                prof.disable()
            first = time.perf_counter() - start
        backend = watch.total_s - before if watch else None
    if args.prof and prof is not None:
        prof.dump_stats(args.prof)
    print(
        json.dumps(
            {
                "first_call_s": round(first, 3),
                "backend_s": None if backend is None else round(backend, 3),
                "imports": imports.count,
                "imports_s": round(sum(imports.by_package.values()), 3),
                "imports_top": [(k, round(v, 3)) for k, v in imports.by_package.most_common(8)],
                "cxx_runs": len(cxx.runs),
                "cxx_s": round(sum(t for t, _ in cxx.runs), 3),
                "cxx_source_bytes": sum(n for _, n in cxx.runs),
                "vfuse_top": _top_vfuse(prof, args.top) if prof is not None and args.top else [],
                "profiled": prof is not None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
