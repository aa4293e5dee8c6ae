"""Compile a translation unit to a shared library, cached on disk by content hash.

Key: sha256 of (source, compiler path and version, flags). The .so is compiled to a unique
temporary name in the cache directory and moved into place with os.replace (atomic on POSIX),
then a sidecar `<key>.ok` holding the sha256 of the .so bytes is written the same way. A .so
without a matching sidecar (half-written, truncated, corrupted) is rebuilt; a .so that
dlopen rejects is rebuilt once. An exclusive fcntl lock per key makes concurrent compiles of
the same graph (several processes) build it once.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vfuse.errors import VfuseCompileError, VfuseError

FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
    "-w",
)
LIBS = ("-lmvec", "-lm")


class CompilerNotFound(VfuseError, RuntimeError):
    """No working C++ compiler (the runtime warns and falls back to the reference executor)."""


class CompileError(VfuseCompileError):
    """The C++ compiler rejected generated code; the message holds its diagnostics and the file."""


@dataclass(frozen=True)
class Toolchain:
    cxx: str
    version: str
    flags: tuple[str, ...] = FLAGS
    libs: tuple[str, ...] = LIBS


def find_toolchain(cxx: str | None = None) -> Toolchain:
    """The compiler named by `cxx`, else $VFUSE_CXX, else $CXX, else g++; raise CompilerNotFound."""
    name = cxx or os.environ.get("VFUSE_CXX") or os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise CompilerNotFound(f"C++ compiler '{name}' not found (set VFUSE_CXX or CXX to a g++ that supports OpenMP)")
    try:
        st = os.stat(path)
        version = _version(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerNotFound(f"C++ compiler '{path}' does not run: {e}") from e
    return Toolchain(path, version)


@functools.lru_cache(maxsize=16)
def _version(path: str, identity: tuple[int, int, int, int]) -> str:
    """First line of `path --version`. Remembered per process, keyed by the file's identity
    (a replaced compiler is asked again): running it costs a fork and exec of the driver,
    3-7 ms, which was a third of a cached compile. Failures are not remembered."""
    del identity  # only part of the memo key
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()[0] if out.stdout else ""


def cache_key(source: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (source, tc.cxx, tc.version, *tc.flags, *tc.libs):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _valid(so: Path, marker: Path) -> bool:
    try:
        return marker.read_text().strip() == _digest(so)
    except OSError:
        return False


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _compile(source: str, so: Path, tc: Toolchain) -> None:
    cpp = so.with_suffix(".cpp")
    _atomic_write(cpp, source)
    fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=so.stem, suffix=".so.tmp")
    os.close(fd)
    cmd = [tc.cxx, *tc.flags, str(cpp), "-o", tmp, *tc.libs]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except OSError as e:
        os.unlink(tmp)
        raise CompilerNotFound(f"cannot run {tc.cxx}: {e}") from e
    if res.returncode != 0:
        os.unlink(tmp)
        first = next((line for line in res.stderr.splitlines() if "error" in line), "")
        raise CompileError(f"{tc.cxx} failed on {cpp}: {first}\n{res.stderr[-4000:]}")
    os.replace(tmp, so)


def build_library(source: str, cache_dir: Path, tc: Toolchain) -> Path:
    """Path of a valid .so for `source`, compiling it unless the cache has it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key(source, tc)
    so, marker = cache_dir / f"vf_{key}.so", cache_dir / f"vf_{key}.ok"
    if so.exists() and _valid(so, marker):
        return so
    with open(cache_dir / f"vf_{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (so.exists() and _valid(so, marker)):  # another process may have built it meanwhile
            _compile(source, so, tc)
            _atomic_write(marker, _digest(so))
    return so


def load_library(source: str, cache_dir: Path, tc: Toolchain) -> ctypes.CDLL:
    """Build (or find) and dlopen the library; a cached file dlopen rejects is rebuilt once."""
    so = build_library(source, cache_dir, tc)
    try:
        return ctypes.CDLL(str(so))
    except OSError:
        so.with_suffix(".ok").unlink(missing_ok=True)
        so = build_library(source, cache_dir, tc)
        return ctypes.CDLL(str(so))
