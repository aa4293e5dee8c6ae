"""The prelude plus test loops compiled to assembly with the kernels' flags, and one function's body."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.toolchain import find_toolchain


def prelude_asm(tmp_path: Path, loops: str) -> str:
    """Assembly of PRELUDE + `loops` (extern "C" functions) at this machine's tier."""
    cpp = tmp_path / "loops.cpp"
    cpp.write_text(PRELUDE + loops)
    tc = find_toolchain()
    subprocess.run([tc.cxx, *tc.flags, "-S", str(cpp), "-o", str(tmp_path / "loops.s")], check=True)
    return (tmp_path / "loops.s").read_text()


def body(asm: str, function: str) -> str:
    """The instructions of `function` in `asm`."""
    return asm.split(f"\n{function}:", 1)[1].split(".cfi_endproc", 1)[0]
