"""Compile generated kernels for a GPU without one, and read their on-chip resources.

`triton.compile(ASTSource(fn, signature, attrs), target=GPUTarget("cuda", sm, 32))` runs the
whole pipeline (TTIR, TTGIR, LLVM IR, PTX, cubin: ptxas ships with triton) on any machine.
Registers and spills come from `ptxas -v` on the PTX, shared memory from Triton's allocation.
Pointer parameters are compiled as 16-byte aligned, as Triton specializes them at launch for
torch's allocations and vfuse's 64-byte aligned arena. The planner's register budget can later
be checked against these figures (issue 13, item 2).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.render import TritonProgram


@dataclass(frozen=True)
class Resources:
    """What one kernel takes of an SM, per thread (registers, spills) and per program (shared)."""

    registers: int
    spill_bytes: int  # bytes spilled to local memory (stores)
    shared_bytes: int
    ptx: str = ""

    def as_dict(self) -> dict[str, int]:
        return {"registers": self.registers, "spill_bytes": self.spill_bytes, "shared_bytes": self.shared_bytes}


def compile_kernel(module: Any, fn: str, signature: dict[str, str], warps: int, sm: int = 90) -> Any:
    """`fn` of a jit-loaded module compiled for compute capability `sm` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t.startswith("*")}
    src = ASTSource(getattr(module, fn), signature, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})


def resources_of(compiled: Any, sm: int = 90) -> Resources:
    """Registers and spills from ptxas on the kernel's PTX; shared memory from Triton."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = compiled.asm["ptx"]
    arch = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    with tempfile.TemporaryDirectory(prefix="vfuse-ptxas-") as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [get_ptxas(sm).path, "-v", f"--gpu-name={arch.group(1) if arch else 'sm_90a'}", str(src)]
        out = subprocess.run([*cmd, "-o", str(Path(d) / "k.o")], capture_output=True, text=True, check=True)
    log = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return Resources(
        int(regs.group(1)) if regs else 0, int(spills.group(1)) if spills else 0, int(compiled.metadata.shared), ptx
    )


def pressure(program: TritonProgram, cache_dir: Path, sm: int = 90) -> dict[str, Resources]:
    """Every launched function of `program` compiled for `sm` (90: H100 / H200, 80: A100)."""
    module = load_module(module_path(program.source, cache_dir), interpret=False)
    out = {}
    for ln in program.launches:
        if ln.fn not in out:
            out[ln.fn] = resources_of(compile_kernel(module, ln.fn, program.signatures[ln.fn], ln.warps, sm), sm)
    return out
