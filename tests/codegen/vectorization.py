"""Which `omp simd` loops of a generated source g++ really vectorizes (from -fopt-info)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from vfuse.codegen.cpp.toolchain import find_toolchain


def simd_loops_vectorized(source: str, tmp_path: Path) -> tuple[set[int], set[int]]:
    cpp = tmp_path / "k.cpp"
    cpp.write_text(source)
    tc = find_toolchain()
    flags = ["-fopt-info-vec-optimized", "-fopt-info-vec-missed"]
    cmd = [tc.cxx, *tc.flags, *flags, str(cpp), "-o", str(tmp_path / "k.so"), *tc.libs]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    vectorized = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    # A strips lane loop (codegen/cpp/strips.py) is vectorized around its chain loop; g++
    # reports that at the chain loop, as a loop it did not vectorize itself.
    outer = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: missed: outer-loop already vectorized", report)}
    lines = source.splitlines()
    simd = {i + 1 for i, line in enumerate(lines) if "#pragma omp" in line and "simd" in line}
    # A prelude template no kernel instantiates (vf_check_rows without a gather) gets no report at all.
    reported = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: (?:optimized|missed)", report)}
    simd = {p for p in simd if reported & {p + 1, p + 2, p + 3}}
    chain = {p: _chain_loop(lines, p) for p in simd}
    # g++ reports a loop at its `for` line or at the first statement of its body, or of what is
    # left of it after hoisting a loop-invariant load (a gather's row index).
    return simd, {p for p in simd if vectorized & {p + 1, p + 2, p + 3} or chain[p] in outer}


def _chain_loop(lines: list[str], pragma: int) -> int:
    """The line of the chain loop inside a strips lane loop at `pragma` (1-based), else 0."""
    if "for (int64_t sl = 0; sl < 16;" not in lines[pragma]:
        return 0
    return next((i + 1 for i in range(pragma, len(lines)) if "for (int64_t sj = 0;" in lines[i]), 0)
