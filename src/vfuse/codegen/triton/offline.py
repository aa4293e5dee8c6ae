"""Compile generated kernels for a GPU without one, and read their on-chip resources.

`triton.compile(ASTSource(fn, signature, attrs), target=GPUTarget("cuda", sm, 32))` runs the
whole pipeline (TTIR, TTGIR, LLVM IR, PTX, cubin: ptxas ships with triton) on any machine.
Registers and spills come from `ptxas -v` on the PTX, shared memory from Triton's allocation.
Pointer parameters are compiled as 16-byte aligned, as Triton specializes them at launch for
torch's allocations and vfuse's 64-byte aligned arena. `measure` keeps each kernel's figures in
the kernel cache (a compile takes 0.1-1 s), keyed by the function's own text, the helpers, its
signature, warps, the SM and Triton's version: the planner's on-chip rule (`fusion/onchip.py`)
compiles the same kernels again whenever a model is compiled again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfuse.cachedir import usable_dir
from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.prelude import PRELUDE
from vfuse.codegen.triton.render import Launch, TritonProgram


@dataclass(frozen=True)
class Resources:
    """What one kernel takes of an SM, per thread (registers, spills) and per program (shared)."""

    registers: int
    spill_bytes: int  # bytes spilled to local memory (stores)
    shared_bytes: int
    ptx: str = ""

    def as_dict(self) -> dict[str, int]:
        return {"registers": self.registers, "spill_bytes": self.spill_bytes, "shared_bytes": self.shared_bytes}


def compile_kernel(module: Any, fn: str, signature: dict[str, str], warps: int, sm: int = 90, stages: int = 0) -> Any:
    """`fn` of a jit-loaded module compiled for compute capability `sm` (no GPU needed), with
    `stages` software-pipeline stages as its launch has them (0: Triton's default)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton

    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t.startswith("*")}
    src = ASTSource(getattr(module, fn), signature, attrs=attrs)
    options = {"num_warps": warps, **({"num_stages": stages} if stages else {})}
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options=options)


def resources_of(compiled: Any, sm: int = 90) -> Resources:
    """Registers and spills from ptxas on the kernel's PTX; shared memory from Triton."""
    ptx = compiled.asm["ptx"]
    arch = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    with tempfile.TemporaryDirectory(prefix="vfuse-ptxas-") as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [_ptxas(sm), "-v", f"--gpu-name={arch.group(1) if arch else 'sm_90a'}", str(src)]
        out = subprocess.run([*cmd, "-o", str(Path(d) / "k.o")], capture_output=True, text=True, check=True)
    log = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return Resources(
        int(regs.group(1)) if regs else 0, int(spills.group(1)) if spills else 0, int(compiled.metadata.shared), ptx
    )


def _ptxas(sm: int) -> str:
    """The ptxas Triton ships, across Triton versions (3.7 takes the SM, some earlier ones not)."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        found = get_ptxas(sm)
    except TypeError:
        found = get_ptxas()  # type: ignore[call-arg]
    return str(getattr(found, "path", found))


def pressure(program: TritonProgram, cache_dir: Path, sm: int = 90) -> dict[str, Resources]:
    """Every launched function of `program` compiled for `sm` (90: H100 / H200, 80: A100)."""
    module = load_module(module_path(program.source, cache_dir), interpret=False)
    out = {}
    for ln in program.launches:
        if ln.fn not in out:
            out[ln.fn] = resources_of(
                compile_kernel(module, ln.fn, program.signatures[ln.fn], ln.warps, sm, ln.stages), sm
            )
    return out


def precompile(
    program: TritonProgram,
    path: Path,
    sm: int,
    workers: int | None = None,
    compile_fn: Callable[..., Any] | None = None,
) -> dict[tuple[str, int, int], Future]:
    """Every launched function of `program` (its module at `path`) compiled for `sm` at once, in
    a thread pool, ahead of the first launches: Triton's cache then holds each kernel under the
    key its JIT computes at a launch with 16-byte aligned pointers (the same function source,
    pointer attributes and options), so those launches load it instead of compiling one after
    another. Returns when all are done: (function, warps, stages) -> its future (a failure is
    left to the JIT launch, which raises it as before); nothing for a single kernel."""
    jobs = {(ln.fn, ln.warps, ln.stages): ln for ln in program.launches}
    if len(jobs) < 2:  # nothing to overlap: the launch compiles it as soon
        return {}
    module = load_module(path, interpret=False)
    compile_fn = compile_fn or compile_kernel
    out: dict[tuple[str, int, int], Future] = {}
    with ThreadPoolExecutor(min(len(jobs), workers or min(16, os.cpu_count() or 1)), "vfuse-compile") as pool:
        for key, ln in jobs.items():
            out[key] = pool.submit(compile_fn, module, ln.fn, program.signatures[ln.fn], ln.warps, sm, ln.stages)
    return out


def measure(program: TritonProgram, cache_dir: Path, sm: int = 90) -> dict[str, Resources]:
    """`pressure`, each kernel's figures read from the kernel cache when it was compiled before
    (without its PTX)."""
    import triton

    folder = usable_dir(cache_dir / "triton" / "onchip")
    module = None
    out: dict[str, Resources] = {}
    for ln in program.launches:
        if ln.fn in out:
            continue
        key = _cache_key(program, ln, sm, triton.__version__)
        res = _read(folder / f"{key}.json") if folder else None
        if res is None:
            module = module or load_module(module_path(program.source, cache_dir), interpret=False)
            res = resources_of(compile_kernel(module, ln.fn, program.signatures[ln.fn], ln.warps, sm, ln.stages), sm)
            if folder:
                _write(folder / f"{key}.json", res)
        out[ln.fn] = res
    return out


def _cache_key(program: TritonProgram, ln: Launch, sm: int, version: str) -> str:
    """What a kernel's compiled figures depend on: its function's text (up to the next
    top-level definition), the helpers every module starts with, signature, warps, SM, Triton."""
    start = program.source.index(f"\ndef {ln.fn}(")
    end = program.source.find("\ndef ", start + 1)
    text = program.source[start : end if end >= 0 else len(program.source)]
    sig = repr(sorted(program.signatures[ln.fn].items()))
    parts = [PRELUDE, text, sig, str(ln.warps), str(ln.stages), str(sm), version]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _read(path: Path) -> Resources | None:
    try:
        d = json.loads(path.read_text())
        return Resources(int(d["registers"]), int(d["spill_bytes"]), int(d["shared_bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, res: Resources) -> None:
    tmp = path.with_suffix(f".{id(res)}.tmp")
    try:
        tmp.write_text(json.dumps(res.as_dict()))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
