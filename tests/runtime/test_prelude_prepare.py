"""The precompiled prelude's background build starts when a backend is made (torch.compile time),
so that it overlaps Dynamo's tracing; backends that compile no C++ start none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_CODE = """
import sys
import vfuse
from vfuse.codegen.cpp import toolchain
b = vfuse.backend(cache_dir={cache!r}, backend={backend!r})
sys.exit(0 if toolchain.find_toolchain().pch.started else 3)
"""


def _started(tmp_path: Path, backend: str) -> bool:
    env = {**os.environ}
    env.pop("VFUSE_PCH", None)
    code = _CODE.format(cache=str(tmp_path / "cache"), backend=backend)
    rc = subprocess.run([sys.executable, "-c", code], env=env, timeout=300, check=False).returncode
    assert rc in (0, 3)
    return rc == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="built in the background on two cores or more")
def test_backend_starts_the_prelude_build(tmp_path: Path) -> None:
    assert _started(tmp_path, "cpp")


def test_interp_backend_starts_no_compiler(tmp_path: Path) -> None:
    assert not _started(tmp_path, "interp")
    assert not list((tmp_path / "cache").glob("vf_pch_*"))
