"""On-device autotuning of the contraction templates' tiles, with the choices cached.

The schedule picks each template's tiles from its preset table (`schedule/gpu.py`) and lists
the candidates around them (`schedule.gpu.candidates`, each within the preset's shared memory).
On a GPU, `Autotuner.tune` times every candidate of every template with `timer` (`cuda_timer`:
the template alone, on random operands of its shapes, timed by `triton.testing.do_bench`) and
keeps the fastest; without a timer (CPU tensors, the interpreter) the table's tiles stay. A
choice is cached in `<cache_dir>/triton/autotune.json` under its key: the preset, the
contraction and its shapes, the dot's dtype, the layout flags and the epilogue (which changes
the registers a tile needs), so a model compiled again, or another graph with the same GEMM,
is not timed twice. The cache holds tile sizes only: a planted entry can make a kernel slower,
never wrong (a cached choice is used only when it is one of the schedule's candidates).

Compiling the candidates, not timing them, is what a first call waits for (1-14 s each; the
GPT-2 block's three templates took 107 s one after another on the H200's host). A timer with a
`prepare` method (`cuda_timer`'s) is first given every candidate of every template still to be
tuned, and compiles them all concurrently (`triton.compile` ahead of launch, in threads: Triton's
passes and ptxas run outside the GIL); timing then launches the compiled kernels.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from vfuse.cachedir import usable_dir
from vfuse.schedule.kernel import ContractionKernel, GpuTiles, Program, Segment

# Seconds one launch of the kernel (with its candidate tiles) takes, in `program`.
Timer = Callable[[ContractionKernel, Program], float]
CACHE_FILE = "autotune.json"


class Prepares(Protocol):
    """A timer that can compile the kernels it will time ahead of timing them, all at once."""

    def prepare(self, kernels: Sequence[ContractionKernel], program: Program) -> None: ...


def tune_key(k: ContractionKernel, preset: str) -> str:
    """What the best tiles depend on (the names of the IR values do not enter)."""
    assert k.gpu is not None
    geometry = {a: k.attrs[a] for a in ("stride", "padding", "dilation", "groups", "causal", "gqa") if a in k.attrs}
    epilogue = hashlib.sha256(repr([(type(s).__name__, getattr(s, "op", None)) for s in k.epilogue]).encode())
    layout = k.gpu.layout.value if k.gpu.layout is not None else ""  # a conv's NHWC / NCHW reads
    fields = [preset, k.op.value, [list(s) for s in k.shapes], list(k.out_shape), k.gpu.dot, k.trans_b, layout]
    fields += [[p is not None for p in k.prologues], sorted((a, str(v)) for a, v in geometry.items())]
    return json.dumps([*fields, epilogue.hexdigest()[:16]])


class Autotuner:
    """Chooses each template's tiles: timed on a device (`timer`), else the table's; cached."""

    def __init__(self, cache_dir: Path | None, timer: Timer | None = None) -> None:
        self.timer = timer
        self.folder = usable_dir(cache_dir / "triton") if cache_dir is not None else None
        self.choices: dict[str, dict[str, object]] = self._read()
        self.timed = 0  # candidates timed by this tuner (the cache spares the rest)
        self.compile_s = 0.0  # wall seconds the timer's `prepare` took (candidates compiled ahead)

    def choose(self, k: ContractionKernel, program: Program, preset: str, candidates: Sequence[GpuTiles]) -> GpuTiles:
        """The tiles `k` runs with: cached, else the fastest candidate, else the table's (`k.gpu`)."""
        assert k.gpu is not None
        key = tune_key(k, preset)
        hit = self._cached(k, preset, candidates)
        if hit is not None:
            return hit
        if self.timer is None or not candidates:
            return k.gpu
        times = []
        for c in candidates:
            times.append((self.timer(dataclasses.replace(k, gpu=c), program), len(times), c))
            self.timed += 1
        best = min(times)[2]
        self.choices[key] = dataclasses.asdict(best)
        self._write()
        return best

    def _cached(self, k: ContractionKernel, preset: str, candidates: Sequence[GpuTiles]) -> GpuTiles | None:
        cached = self.choices.get(tune_key(k, preset))
        return next((c for c in candidates if dataclasses.asdict(c) == cached), None) if cached else None

    def tune(
        self, program: Program, preset: str, candidates: Callable[[ContractionKernel], Sequence[GpuTiles]]
    ) -> Program:
        """`program` with every contraction template's tiles chosen (`candidates`: the schedule's
        list for a kernel, `schedule.gpu.candidates` bound to the target)."""
        lists = {k.name: list(candidates(k)) for k in program.kernels if isinstance(k, ContractionKernel) and k.gpu}
        self._prepare(program, preset, lists)
        steps = []
        for step in program.steps:
            if isinstance(step, Segment):
                kernels = tuple(
                    dataclasses.replace(k, gpu=self.choose(k, program, preset, lists[k.name]))
                    if isinstance(k, ContractionKernel) and k.gpu is not None
                    else k
                    for k in step.kernels
                )
                step = dataclasses.replace(step, kernels=kernels)
            steps.append(step)
        return dataclasses.replace(program, steps=tuple(steps))

    def _prepare(self, program: Program, preset: str, lists: dict[str, list[GpuTiles]]) -> None:
        """Every candidate the timer will time, handed to its `prepare` at once (compiled
        concurrently), the cached choices' templates left out."""
        prepare = getattr(self.timer, "prepare", None)
        if prepare is None:
            return
        todo = [
            dataclasses.replace(k, gpu=c)
            for k in program.kernels
            if isinstance(k, ContractionKernel) and k.gpu is not None
            if self._cached(k, preset, lists[k.name]) is None
            for c in lists[k.name]
        ]
        if todo:
            start = time.perf_counter()
            prepare(todo, program)
            self.compile_s += time.perf_counter() - start

    def _read(self) -> dict[str, dict[str, object]]:
        if self.folder is None:
            return {}
        try:
            data = json.loads((self.folder / CACHE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}

    def _write(self) -> None:
        """Atomically (a temp file renamed into place): concurrent tuners lose an entry at worst."""
        if self.folder is None:
            return
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix="autotune.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.choices, f, indent=0, sort_keys=True)
            os.replace(tmp, self.folder / CACHE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def template_module(k: ContractionKernel, program: Program) -> tuple[str, Any, dict[str, str]]:
    """The template alone in a module of its own: its source, its `Launch` and its signature."""
    from vfuse.codegen.triton.prelude import PRELUDE
    from vfuse.codegen.triton.render import HEADER, TEMPLATE_CONSTANTS, render_template
    from vfuse.codegen.triton.writer import FaultTable

    text, ln, sig = render_template(k, program, FaultTable())
    return "\n\n".join([HEADER, PRELUDE, TEMPLATE_CONSTANTS, text]) + "\n", ln, sig


# (jit-loaded module, function, signature, warps, sm, stages) -> a compiled kernel (offline.compile_kernel)
Compile = Callable[[Any, str, dict[str, str], int, int, int], Any]


class TemplateTimer:
    """`cuda_timer`'s timer: `prepare` compiles every candidate for the device's SM at once in a
    thread pool (`offline.compile_kernel`: the pipeline Triton runs at a first launch, ahead of
    it; pointers 16-byte aligned, as torch's allocations are); a call launches the compiled
    kernel on random operands (zeros for the seeds), timed by triton.testing.do_bench (median,
    L2 flushed between runs). A candidate that failed to compile ahead, or was not prepared, is
    compiled when timed (its error, if any, raised there). Timing needs a GPU; `prepare` does
    not (`sm` given)."""

    def __init__(self, cache_dir: Path, reps: int = 25, sm: int | None = None, workers: int | None = None,
                 compile_fn: Compile | None = None) -> None:  # fmt: skip
        self.cache_dir, self.reps, self.sm = cache_dir, reps, sm
        self.workers = workers or max(1, min(16, os.cpu_count() or 1))
        self.compile_fn = compile_fn
        self.compiled: dict[tuple[str, str, int, int], Future] = {}

    def _sm(self) -> int:
        if self.sm is None:
            import torch

            major, minor = torch.cuda.get_device_capability()
            self.sm = major * 10 + minor
        return self.sm

    def _job(self, k: ContractionKernel, program: Program) -> tuple[tuple[str, str, int, int], Any, Any]:
        from vfuse.codegen.triton.module import load_module, module_path

        source, ln, sig = template_module(k, program)
        key = (source, ln.fn, ln.warps, ln.stages)
        return key, ln, (lambda: load_module(module_path(source, self.cache_dir), False), sig)

    def prepare(self, kernels: Sequence[ContractionKernel], program: Program) -> None:
        from vfuse.codegen.triton.offline import compile_kernel

        compile_fn = self.compile_fn or compile_kernel
        sm = self._sm()
        jobs = {}
        for k in kernels:  # two templates alike (one shape, one epilogue) compile once
            key, ln, (load, sig) = self._job(k, program)
            if key not in self.compiled and key not in jobs:
                jobs[key] = (load(), ln, sig)  # modules loaded here: imports stay on one thread
        if not jobs:
            return
        with ThreadPoolExecutor(min(self.workers, len(jobs)), thread_name_prefix="vfuse-tune") as pool:
            for key, (module, ln, sig) in jobs.items():
                self.compiled[key] = pool.submit(compile_fn, module, ln.fn, sig, ln.warps, sm, ln.stages)
        for f in self.compiled.values():
            f.exception()  # wait for all; a failure is raised when that candidate is timed

    def kernel(self, k: ContractionKernel, program: Program) -> tuple[Any, Any]:
        """The compiled kernel of `k` (prepared, else compiled now) and its launch."""
        key, ln, (load, sig) = self._job(k, program)
        done = self.compiled.get(key)
        if done is None or done.exception() is not None:
            from vfuse.codegen.triton.offline import compile_kernel

            return (self.compile_fn or compile_kernel)(load(), ln.fn, sig, ln.warps, self._sm(), ln.stages), ln
        return done.result(), ln

    def __call__(self, k: ContractionKernel, program: Program) -> float:
        import torch
        import triton.testing

        from vfuse.codegen.triton.writer import SEEDS

        compiled, ln = self.kernel(k, program)
        args = []
        for v in ln.args:
            if v == SEEDS:
                args.append(torch.zeros(max(len(program.seeds), 1), dtype=torch.int64, device="cuda"))
                continue
            t = program.buffers[v].type
            dtype = t.dtype.torch
            args.append(
                torch.randn(t.shape, device="cuda").to(dtype)
                if dtype.is_floating_point
                else torch.zeros(t.shape, dtype=dtype, device="cuda")
            )
        launch = compiled[(ln.grid, 1, 1)]
        try:
            launch(*args)
        except Exception:  # a Triton that launches compiled kernels otherwise: the JIT path, as before
            from vfuse.codegen.triton.module import load_module, module_path

            fn = getattr(load_module(module_path(template_module(k, program)[0], self.cache_dir), False), ln.fn)
            stages = {"num_stages": ln.stages} if ln.stages else {}
            launch = lambda *a: fn[(ln.grid,)](*a, num_warps=ln.warps, **stages)  # noqa: E731
        ms = triton.testing.do_bench(lambda: launch(*args), rep=self.reps, return_mode="median")
        return float(ms) * 1e-3


def cuda_timer(cache_dir: Path, reps: int = 25) -> Timer:
    """A `Timer` for a CUDA device, compiling the candidates ahead (`TemplateTimer`). Needs a GPU:
    not run by the CPU test suite (its `prepare` is: `tests/triton/test_autotune_compile.py`)."""
    return TemplateTimer(cache_dir, reps)
