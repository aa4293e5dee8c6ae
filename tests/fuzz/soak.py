"""`make fuzz`: the differential fuzzer for VFUSE_FUZZ_MINUTES (default 10), then every OpInfo sample.

Runs the fuzz tests in rounds of fresh random programs (VFUSE_FUZZ=soak: random seeds, failures
shrunk), each round a pytest run whose hypothesis seed is printed so a failure can be replayed
with `VFUSE_FUZZ=soak pytest tests/fuzz --hypothesis-seed=SEED`; then the per-process races
(tests/runtime/test_omp_start.py, 40 processes). Then the full OpInfo run
(every sample, float32 and one low-precision dtype; VFUSE_FUZZ_OPINFO=0 skips it), its summary
written to VFUSE_OPINFO_REPORT (default build/opinfo_report.txt). Exits non-zero on a failure.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = (
    ("tests/fuzz/test_fuzz_forward.py", 40),
    ("tests/fuzz/test_fuzz_backward.py", 15),
    ("tests/fuzz/test_fuzz_dynamic.py", 15),
    ("tests/fuzz/test_fuzz_gemm_views.py", 20),
    ("tests/fuzz/test_fuzz_attention_dropout.py", 10),
    ("tests/fuzz/test_fuzz_warm.py", 8),
    ("tests/fuzz/test_fuzz_library.py", 10),
)
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=0"]


def run_round(test: str, examples: int, seed: int) -> bool:
    env = {**os.environ, "VFUSE_FUZZ": "soak", "VFUSE_FUZZ_EXAMPLES": str(examples)}
    start = time.monotonic()
    # One file: in this process (-n 0), so that the rate measures the programs, not the workers' start.
    done = subprocess.run([*PYTEST, "-n", "0", "-x", test, f"--hypothesis-seed={seed}"], env=env, check=False)
    took = time.monotonic() - start
    print(f"fuzz: {test} seed {seed}: {examples} programs in {took:.0f} s ({60 * examples / took:.1f} per minute)")
    return done.returncode == 0


def fuzz(minutes: float) -> bool:
    deadline = time.monotonic() + 60 * minutes
    turn = 0
    while time.monotonic() < deadline:
        test, examples = ROUNDS[turn % len(ROUNDS)]
        seed = random.SystemRandom().randrange(2**32)
        print(f"fuzz: round {turn + 1}, replay with VFUSE_FUZZ=soak pytest {test} --hypothesis-seed={seed}")
        if not run_round(test, examples, seed):
            return False
        turn += 1
    return True


def opinfo() -> bool:
    report = Path(os.environ.get("VFUSE_OPINFO_REPORT", "build/opinfo_report.txt"))
    report.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VFUSE_FUZZ": "soak", "VFUSE_OPINFO_REPORT": str(report)}
    # Every sample of an op in its own test: spread the tests over the workers, not whole files.
    done = subprocess.run([*PYTEST, "--no-header", "--dist", "load", "tests/opinfo"], env=env, check=False)
    print(f"opinfo: summary in {report}")
    return done.returncode == 0


def races() -> bool:
    """Rare per-process races, each in many fresh processes (tests skipped outside VFUSE_FUZZ=soak)."""
    env = {**os.environ, "VFUSE_FUZZ": "soak"}
    done = subprocess.run([*PYTEST, "-n", "0", "tests/runtime/test_omp_start.py"], env=env, check=False)
    return done.returncode == 0


def main() -> int:
    ok = fuzz(float(os.environ.get("VFUSE_FUZZ_MINUTES", "10"))) and races()
    if ok and os.environ.get("VFUSE_FUZZ_OPINFO", "1") != "0":
        ok = opinfo()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
