"""Settings for the whole test suite, and what it needs to run under pytest-xdist.

`make test` runs the suite in one worker process per CPU (`-n logical` in pyproject.toml);
`pytest -n 0` runs it in this process alone. Each test file runs whole on one worker (`--dist
loadfile`): files share compiled models through module fixtures and caches. The OpInfo results
are sent from the workers to this process, which prints their summary at the end.
"""

from __future__ import annotations

import os

import pytest
from tests.opinfo.records import ROWS, Row, summary

# Native code vfuse cannot build (C++ g++ rejects, an exception while scheduling or rendering)
# is a vfuse bug: in the tests it raises VfuseCodegenError instead of quietly running the
# graph on the reference executor, where it would pass every numeric comparison.
os.environ.setdefault("VFUSE_RAISE_CODEGEN_ERRORS", "1")
# The IR's invariants are checked after lowering and after every optimization pass.
os.environ.setdefault("VFUSE_VERIFY", "1")
# Plans are asserted for the torch-measured cpu target: a `vfuse calibrate` in the developer's cache
# (calibration_cpu.json) plans differently (small GEMMs to torch, ...). Tests of the calibration
# itself opt in with get_target(..., calibrated=True) on their own cache directories.
os.environ.setdefault("VFUSE_CALIBRATION", "off")
# A forced lower tier plans as that tier's machines do (torch's libraries as wide as the tier): the
# VFUSE_ISA=avx2 runs exercise the AVX2 templates an AVX2 CPU gets, not torch's AVX-512 GEMMs
# (`targets/cpu.library_width`; tests/fusion/test_library_attention.py tests the CPU-width default).
os.environ.setdefault("VFUSE_LIBRARY_WIDTH", "tier")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pytest_configure(config: pytest.Config) -> None:
    """A worker's torch threads: its share of the CPUs, but two at least (where there are two), so
    that the kernels' threaded paths run in every test as they do in a serial run; on two CPUs
    that is torch's own default. Tests that need other counts set them and restore them."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    import torch

    cpus = _cpus()
    torch.set_num_threads(min(cpus, max(2, cpus // int(workerinput["workercount"]))))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a worker: plain tuples travel to the controller
        workeroutput["vfuse_opinfo"] = [tuple(r) for r in session.config.stash.get(ROWS, [])]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when it is not loaded (-p no:xdist)
def pytest_testnodedown(node: object, error: object) -> None:
    rows = getattr(node, "workeroutput", {}).get("vfuse_opinfo", [])
    node.config.stash.setdefault(ROWS, []).extend(Row(*r) for r in rows)  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    rows = config.stash.get(ROWS, [])
    if not rows:
        return
    text = summary(rows)
    terminalreporter.write_line(text)
    if os.environ.get("VFUSE_OPINFO_REPORT"):
        with open(os.environ["VFUSE_OPINFO_REPORT"], "w") as f:
            f.write(text + "\n")
