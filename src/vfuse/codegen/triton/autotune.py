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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from vfuse.cachedir import usable_dir
from vfuse.schedule.kernel import ContractionKernel, GpuTiles, Program, Segment

# Seconds one launch of the kernel (with its candidate tiles) takes, in `program`.
Timer = Callable[[ContractionKernel, Program], float]
CACHE_FILE = "autotune.json"


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

    def choose(self, k: ContractionKernel, program: Program, preset: str, candidates: Sequence[GpuTiles]) -> GpuTiles:
        """The tiles `k` runs with: cached, else the fastest candidate, else the table's (`k.gpu`)."""
        assert k.gpu is not None
        key = tune_key(k, preset)
        cached = self.choices.get(key)
        if cached is not None:
            hit = next((c for c in candidates if dataclasses.asdict(c) == cached), None)
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

    def tune(
        self, program: Program, preset: str, candidates: Callable[[ContractionKernel], Sequence[GpuTiles]]
    ) -> Program:
        """`program` with every contraction template's tiles chosen (`candidates`: the schedule's
        list for a kernel, `schedule.gpu.candidates` bound to the target)."""
        steps = []
        for step in program.steps:
            if isinstance(step, Segment):
                kernels = tuple(
                    dataclasses.replace(k, gpu=self.choose(k, program, preset, candidates(k)))
                    if isinstance(k, ContractionKernel) and k.gpu is not None
                    else k
                    for k in step.kernels
                )
                step = dataclasses.replace(step, kernels=kernels)
            steps.append(step)
        return dataclasses.replace(program, steps=tuple(steps))

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


def cuda_timer(cache_dir: Path, reps: int = 25) -> Timer:
    """A `Timer` for a CUDA device: the template alone in a module of its own, on random operands
    (zeros for the seeds), timed by triton.testing.do_bench (median, L2 flushed between runs).
    Needs a GPU: not run by the CPU test suite."""

    def time_kernel(k: ContractionKernel, program: Program) -> float:
        import torch
        import triton.testing

        from vfuse.codegen.triton.module import load_module, module_path
        from vfuse.codegen.triton.prelude import PRELUDE
        from vfuse.codegen.triton.render import HEADER, TEMPLATE_CONSTANTS, render_template
        from vfuse.codegen.triton.writer import SEEDS, FaultTable

        text, ln, _ = render_template(k, program, FaultTable())
        module = load_module(
            module_path("\n\n".join([HEADER, PRELUDE, TEMPLATE_CONSTANTS, text]) + "\n", cache_dir), False
        )
        args = []
        for v in ln.args:
            if v == SEEDS:
                args.append(torch.zeros(max(len(program.seeds), 1), dtype=torch.int64, device="cuda"))
                continue
            t = program.buffers[v].type
            dtype = t.dtype.torch
            shape = t.shape
            args.append(
                torch.randn(shape, device="cuda").to(dtype)
                if dtype.is_floating_point
                else torch.zeros(shape, dtype=dtype, device="cuda")
            )
        fn = getattr(module, ln.fn)
        ms = triton.testing.do_bench(
            lambda: fn[(ln.grid,)](*args, num_warps=ln.warps, num_stages=ln.stages), rep=reps, return_mode="median"
        )
        return float(ms) * 1e-3

    return time_kernel
