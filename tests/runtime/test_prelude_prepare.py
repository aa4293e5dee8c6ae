"""The precompiled prelude's background build starts when a backend is made (torch.compile time),
so that it overlaps Dynamo's tracing; backends that compile no C++ start none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One fresh interpreter for both checks (each used to start its own): the interp backend first,
# while no build can have started in the process, then a C++ backend over another cache directory.
_CODE = """
import json
import vfuse
from vfuse.codegen.cpp import toolchain
seen = {{}}
vfuse.backend(cache_dir={interp!r}, backend="interp")
seen["interp"] = toolchain.find_toolchain().pch.started
vfuse.backend(cache_dir={cpp!r}, backend="cpp")
seen["cpp"] = toolchain.find_toolchain().pch.started
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, bool], Path]:
    """Whether a build had started after each backend was made, and the interp backend's cache."""
    tmp = tmp_path_factory.mktemp("prelude")
    env = {**os.environ}
    env.pop("VFUSE_PCH", None)
    code = _CODE.format(interp=str(tmp / "interp"), cpp=str(tmp / "cpp"))
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), tmp / "interp"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="built in the background on two cores or more")
def test_backend_starts_the_prelude_build(started: tuple[dict[str, bool], Path]) -> None:
    assert started[0]["cpp"]


def test_interp_backend_starts_no_compiler(started: tuple[dict[str, bool], Path]) -> None:
    seen, interp_cache = started
    assert not seen["interp"]
    assert not list(interp_cache.glob("vf_pch_*"))
