"""A/B of one C++ source compiled as one translation unit or split into units in parallel
(codegen/cpp/units.py), interleaved, fresh output directory per build (no cache hit).

    python benchmarks/compile_units_ab.py path/to/vf_<key>.cpp [rounds] [units]

Prints the wall time of each build and the medians. The source must come from the renderer
(a kernel cache's .cpp: it carries the unit marks).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from vfuse.codegen.cpp import toolchain
from vfuse.codegen.cpp.units import split


def _build(source: str, units: int) -> float:
    tc = toolchain.find_toolchain()
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "vf_ab.so"
        start = time.perf_counter()
        if units > 1:
            pieces = split(source, units)
            assert pieces is not None, "source has no unit marks"
            toolchain._compile_units(pieces, so, tc)
        else:
            cpp = so.with_suffix(".cpp")
            cpp.write_text(source)
            toolchain._run([tc.cxx, *tc.flags, str(cpp), "-o", str(so), *tc.libs], cpp, tc)
        return time.perf_counter() - start


def main() -> int:
    source = Path(sys.argv[1]).read_text()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    units = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    times: dict[int, list[float]] = {1: [], units: []}
    for _ in range(rounds):
        for n in (1, units):
            times[n].append(_build(source, n))
            print(f"units={n} {times[n][-1]:.2f} s", flush=True)
    for n, ts in times.items():
        print(f"units={n}: median {statistics.median(ts):.2f} s, min {min(ts):.2f} s ({len(source)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
