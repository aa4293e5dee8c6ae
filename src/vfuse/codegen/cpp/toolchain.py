"""Compile a translation unit to a shared library, cached on disk by content hash.

Key: sha256 of (source, compiler path and version, flags, this CPU's model and ISA flags: the
library is built with -march=native, or the -march of a lower instruction-set tier: `targets.isa`,
`flags_for`). The .so is compiled to a unique temporary name in the cache
directory and moved into place with os.replace (atomic on POSIX), then a marker naming the key,
size and sha256 is written last (`cache.py`); a library is loaded only after it was checked
against its marker right before dlopen, so a half-written, truncated, planted or misnamed one is
rebuilt, and one that dlopen rejects is rebuilt once. An exclusive fcntl lock per key makes
concurrent compiles of the same graph (several processes) build it once. A cache directory that
is unsafe (another owner, writable by others) or read-only is not written; kernels then go to a
private temporary directory, with a CacheDirWarning (`vfuse.cachedir`). A large source is
compiled as several units at once, one per core, and linked (`units.py`, `unit_count`); their
scratch files are temporaries of the same directory, swept like the library's. Units take
the prelude from a precompiled header of the cache where there is one (`pch.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vfuse.cachedir import dir_problem, make_private_dir, private_dir, usable_dir, warn_unused
from vfuse.codegen.cpp.cache import atomic_write, entry, open_lock, publish, sweep_once, validated
from vfuse.codegen.cpp.pch import KEY_TEXT, Pch, PchBuilds
from vfuse.codegen.cpp.units import split
from vfuse.errors import VfuseCompileError, VfuseError
from vfuse.targets.cpu import isa_fingerprint, isa_for
from vfuse.targets.isa import X86, CpuIsa, Isa

FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",  # eager's roundings; templates turn FMA contraction on (render.CONTRACT_FMA)
    "-fPIC",
    "-shared",
    "-w",
)
LIBS = ("-lmvec", "-lm")
# Each unit parses the headers and shared helpers again (~0.45 s of CPU): a split pays off from
# ~100 KB a unit (GPT-2's 250 KB: 2.0 s of g++ as one unit, 1.4 s as two on two idle cores).
# Through the precompiled prelude a unit costs ~0.1 s more, and the kernels that share a GEMM
# instance share a unit (`units._deal`): BERT's 180 KB (quick) as two units took about the CPU
# of one, in ~55 % of its time (docs/perf-log.md, 2026-12-01).
MAX_UNITS = 4
UNIT_BYTES = 100_000
PCH_UNIT_BYTES = 60_000


class CompilerNotFound(VfuseError, RuntimeError):
    """No working C++ compiler (the runtime warns and falls back to the reference executor)."""


class CompileError(VfuseCompileError):
    """The C++ compiler rejected generated code; the message holds its diagnostics and the file."""


@dataclass(frozen=True)
class Toolchain:
    """A compiler with its flags; `pch`: what this process knows of its precompiled preludes and
    the libraries it built (`pch.PchBuilds`), shared by every Toolchain `find_toolchain` gives
    for the same compiler, and no part of the toolchain's identity."""

    cxx: str
    version: str
    flags: tuple[str, ...] = FLAGS
    libs: tuple[str, ...] = LIBS
    pch: PchBuilds = field(default_factory=PchBuilds, compare=False, repr=False)


def flags_for(isa: CpuIsa) -> tuple[str, ...]:
    """FLAGS with the -march (and -mtune) of the instruction-set tier `isa`."""
    return tuple(f for flag in FLAGS for f in (isa.march() if flag == "-march=native" else (flag,)))


def find_toolchain(cxx: str | None = None, isa: Isa | None = None) -> Toolchain:
    """The compiler named by `cxx`, else $VFUSE_CXX, else $CXX, else g++, with the flags of the
    instruction-set tier `isa` (None: this CPU's own); raise CompilerNotFound, or VfuseOptionError
    for a tier this CPU lacks."""
    tier = isa_for(isa)
    name = cxx or os.environ.get("VFUSE_CXX") or os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise CompilerNotFound(f"C++ compiler '{name}' not found (set VFUSE_CXX or CXX to a g++ that supports OpenMP)")
    try:
        st = os.stat(path)
        version = _version(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerNotFound(f"C++ compiler '{path}' does not run: {e}") from e
    flags = (*flags_for(tier), *gcc_workarounds(version, tier))
    return Toolchain(path, version, flags, pch=_builds(path, (st.st_dev, st.st_ino)))


# g++ 12 vectorizes some clamped-index loads (a concatenation's rows under `#pragma omp simd`) into
# AVX2 gathers it then miscompiles: with -mtune=znver3 or haswell a 7x7 conv data gradient's shifted
# tap planes read zeros (tests/codegen/test_gcc_gathers.py). Explicit loads instead of gathers: AVX2
# gathers are microcoded on Zen and slowed by Intel's GDS mitigation anyway (docs/perf-log.md).
NO_GATHERS = "-mtune-ctrl=^use_gather_2parts,^use_gather_4parts,^use_gather"


def gcc_workarounds(version: str, isa: CpuIsa) -> tuple[str, ...]:
    """Flags that steer g++ (12 and later: the tune names exist from 12 on) around its known wrong
    code on x86; none for clang, other compilers or other architectures."""
    match = re.search(r"\b(\d+)\.\d+\.\d+", version)  # "g++ (Debian 12.2.0-14) 12.2.0", "g++ (GCC) 14.1.1 2024..."
    gcc = "clang" not in version.lower() and ("g++" in version or "GCC" in version or "gcc" in version)
    if isa.arch != X86 or not gcc or match is None or int(match.group(1)) < 12:
        return ()
    return (NO_GATHERS,)


@functools.lru_cache(maxsize=16)
def _builds(path: str, identity: tuple[int, int]) -> PchBuilds:
    """The precompiled-prelude builds of the compiler at `path`: one per compiler per process,
    so the thread `prepare` starts is the one its graphs' compiles join."""
    del identity  # only part of the memo key
    return PchBuilds()


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
    for part in (source, tc.cxx, tc.version, *tc.flags, *tc.libs, isa_fingerprint()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _compile(source: str, so: Path, tc: Toolchain, seen: int) -> Path:
    """Compile `source` (written next to `so` as .cpp) into a new temp file; its path. A large
    source is compiled as several units in parallel (`units.py`), each through the precompiled
    prelude where there is one (`pch.py`); should that fail, without it, then as one unit."""
    cpp = so.with_suffix(".cpp")
    atomic_write(cpp, source)
    # A small source does not wait for a header still being built: its prelude costs less.
    pch = tc.pch.prelude_pch(source, so.parent, cache_key(KEY_TEXT, tc), tc, seen, wait=len(source) >= UNIT_BYTES)
    pieces = split(source, unit_count(len(source), pch is not None)) or [source]
    for first in (pch, None) if pch is not None else (None,):
        if first is not None or len(pieces) > 1:
            with contextlib.suppress(CompileError):
                return _compile_units(pieces, so, tc, first)
    fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=so.stem, suffix=".so.tmp")
    os.close(fd)
    try:
        _run([tc.cxx, *tc.flags, str(cpp), "-o", tmp, *tc.libs], cpp, tc)
    except BaseException:  # a timeout or an interrupt too: no temp file left behind
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def unit_count(nbytes: int, precompiled: bool = False) -> int:
    """Units to compile `nbytes` of C++ as: one per core, each of UNIT_BYTES at least
    (PCH_UNIT_BYTES where the prelude comes `precompiled`); VFUSE_CXX_UNITS=n forces n (1: never split)."""
    forced = os.environ.get("VFUSE_CXX_UNITS", "")
    if forced.isdigit() and int(forced) > 0:
        return int(forced)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_UNITS, nbytes // (PCH_UNIT_BYTES if precompiled else UNIT_BYTES)))


def _run(cmd: list[str], cpp: Path, tc: Toolchain) -> None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except OSError as e:
        raise CompilerNotFound(f"cannot run {tc.cxx}: {e}") from e
    if res.returncode != 0:
        first = next((line for line in res.stderr.splitlines() if "error" in line), "")
        raise CompileError(f"{tc.cxx} failed on {cpp}: {first}\n{res.stderr[-4000:]}")


def _compile_units(pieces: list[str], so: Path, tc: Toolchain, pch: Pch | None) -> Path:
    """Each piece to an object file, all at once, then one link into a new temp file (its path);
    one piece is compiled and linked in one go. With `pch`, each piece's prelude comes from it.
    Undefined symbols fail the link: a kernel left out of every unit fails here, not at dlopen.
    The scratch files end in .tmp, so a killed build's are swept like its library's."""
    fd, out = tempfile.mkstemp(dir=so.parent, prefix=so.stem, suffix=".so.tmp")
    os.close(fd)
    scratch: list[str] = []
    extra = pch.flags() if pch is not None else ()
    try:
        cmds = []
        for piece in pieces:
            fd, cpp = tempfile.mkstemp(dir=so.parent, prefix=so.stem, suffix=".cpp.tmp")
            with os.fdopen(fd, "w") as f:
                name = so.with_suffix(".cpp").name if len(pieces) == 1 else Path(cpp).name
                f.write(piece if pch is None else pch.unit(piece, name))
            obj = cpp.removesuffix(".cpp.tmp") + ".o.tmp"
            scratch += [cpp, obj]
            cmds.append([tc.cxx, *(f for f in tc.flags if f != "-shared"), *extra, "-c", "-x", "c++", cpp, "-o", obj])
        if len(cmds) == 1:  # compile and link in one run
            cmds = [[tc.cxx, *tc.flags, *extra, "-x", "c++", scratch[0], "-x", "none", "-o", out, *tc.libs]]
            scratch.pop()
        _run_all(cmds, tc)
        if len(pieces) > 1:
            _run([tc.cxx, *tc.flags, *scratch[1::2], "-o", out, "-Wl,-z,defs", *tc.libs], so, tc)
    except BaseException:  # the linker removes its output when it fails
        Path(out).unlink(missing_ok=True)
        raise
    finally:
        for path in scratch:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return Path(out)


def _run_all(cmds: list[list[str]], tc: Toolchain) -> None:
    """Run the compiler commands at once; CompileError naming the first that failed."""
    try:
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    except OSError as e:
        raise CompilerNotFound(f"cannot run {tc.cxx}: {e}") from e
    try:
        errors = [p.communicate(timeout=600)[1] for p in procs]
    finally:  # an interrupt or a timeout: no compiler left running
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for cmd, p, err in zip(cmds, procs, errors, strict=True):
        if p.returncode != 0:
            raise CompileError(f"{tc.cxx} failed on {cmd[-3]}: {err.decode(errors='replace')[-4000:]}")


def _build_locked(source: str, cache_dir: Path, key: str, tc: Toolchain) -> Path:
    so, marker = entry(cache_dir, key)
    seen = sweep_once(str(cache_dir)) + tc.pch.built(cache_dir)
    lock = open_lock(cache_dir / f"vf_{key}.lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not validated(so, marker, key):  # another process may have built it meanwhile
            publish(_compile(source, so, tc, seen), so, marker, key)
            tc.pch.note_built(cache_dir)
    finally:
        os.close(lock)
    return so


def prepare(cache_dir: Path, isa: str = "auto") -> None:
    """Have the precompiled prelude of `cache_dir` checked or built in the background
    (`pch.start`) while the caller traces and schedules a graph. Quiet: a directory that cannot
    be used or a compiler that does not run is left for the build to report."""
    try:
        make_private_dir(cache_dir)
        if dir_problem(cache_dir) is None:
            tc = find_toolchain(isa=None if isa == "auto" else Isa(isa))
            tc.pch.start(cache_dir, cache_key(KEY_TEXT, tc), tc)
    except (OSError, ValueError, VfuseError):
        return


def build_library(source: str, cache_dir: Path, tc: Toolchain) -> Path:
    """Path of a valid .so for `source`, compiling it unless the cache has it. An unsafe
    `cache_dir` is not used, and one that cannot be written is only read: the library is then
    built in a private directory of this process (both with a CacheDirWarning)."""
    key = cache_key(source, tc)
    home = usable_dir(cache_dir)
    if home is not None:
        so, marker = entry(home, key)
        if validated(so, marker, key):
            return so
        try:
            return _build_locked(source, home, key, tc)
        except OSError as e:  # compiler failures are not OSErrors: this is the directory
            warn_unused(cache_dir, f"cannot be written ({e})")
    return _build_locked(source, private_dir(), key, tc)


def load_library(source: str, cache_dir: Path, tc: Toolchain) -> ctypes.CDLL:
    """Build (or find) and dlopen the library; a cached file dlopen rejects is rebuilt once."""
    so = build_library(source, cache_dir, tc)
    try:
        return ctypes.CDLL(str(so))
    except OSError:
        with contextlib.suppress(OSError):  # a read-only directory: the retry then fails the same way
            so.with_suffix(".ok").unlink(missing_ok=True)
        so = build_library(source, cache_dir, tc)
        return ctypes.CDLL(str(so))
