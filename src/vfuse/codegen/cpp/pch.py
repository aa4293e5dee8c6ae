"""A precompiled header of the C++ prelude, kept in the kernel cache.

Every generated unit starts with `prelude.PRELUDE`; parsing it (the C++ headers and, below
AVX-512, the intrinsics up to AVX2; all of <immintrin.h> at AVX-512) is ~0.45 s of g++'s CPU per
unit on Zen 3, a third to half of a small graph's compile. g++ loads a precompiled header of it
in ~0.05 s instead; building one costs ~0.85 s of CPU (2.4 s with every ISA's intrinsics). So it
is built either in a thread that the entry points start before tracing (`start`, through
`toolchain.prepare`; two cores or more: tracing runs on one, and even a cold one-graph compile
then finds it ready), or synchronously once a directory has seen `BUILD_AFTER` libraries (the
markers its first sweep found plus those this process built there since).

Entry `vf_pch_<key>.{h,h.gch,ok,lock}`, key: `toolchain.cache_key` of `KEY_TEXT` (the prelude's
text) with the compiler, its flags and this CPU: a changed prelude or another tier gets its own.
The header holds the prelude's exact text, so a unit reads the same tokens whether g++ takes the
.gch or (rejecting it, silently) parses the header: the same code either way (`tests/codegen/
test_pch.py` compares the assembly). Built under the key's flock into a temp file (`vf_pch_*.tmp`,
swept like the libraries'), renamed into place, probed with `-H` (which prints `!` for a header
taken precompiled); the marker, written last, names both files' sha256 and the verdict. A header
is used only while its marker matches both files (symlinks refused; hashed again only when a
file's identity changes) and says `used`. Any failure of a compile through it recompiles the full
text without it (`toolchain._compile`). VFUSE_PCH=0 turns it off, =1 builds it on the first unit.
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import hashlib
import os
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vfuse.codegen.cpp.cache import atomic_write, open_lock
from vfuse.codegen.cpp.prelude import PRELUDE

PCH_MAGIC = "vfuse-pch 1"
KEY_TEXT = f"{PCH_MAGIC}\n{PRELUDE}"  # what `toolchain.cache_key` hashes with the compiler, flags and CPU
BUILD_AFTER = 4  # libraries a directory has seen before a header is built for it (each saves ~0.4 s of its 0.85 s)
# Text whose meaning depends on the file it is read from or on what came before: not precompiled.
_UNSAFE = ("__FILE__", "__COUNTER__", "__DATE__", "__TIME__", "__BASE_FILE__", "__INCLUDE_LEVEL__")
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
EVICT_AFTER_S = 3600.0  # a header is rebuilt in ~1.4 s of CPU; one per prelude edit piles up otherwise


class Compiler(Protocol):
    cxx: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Pch:
    """A usable precompiled prelude: `header` (with its .gch) replaces the first `skip` characters,
    `lines` lines, of a source."""

    header: Path
    skip: int
    lines: int

    def flags(self) -> tuple[str, ...]:
        return ("-include", str(self.header))

    def unit(self, source: str, name: str) -> str:
        """`source` less the prelude, its line numbers kept for diagnostics (those of `name`)."""
        return f'#line {self.lines + 1} "{name}"\n{source[self.skip :]}'


def eligible(source: str) -> bool:
    """Whether `source` starts with the prelude and the prelude can be precompiled."""
    return source.startswith(PRELUDE) and PRELUDE.endswith("\n") and not any(w in PRELUDE for w in _UNSAFE)


def mode() -> str:
    """VFUSE_PCH: '0' off, '1' build on the first unit, anything else: after BUILD_AFTER units."""
    value = os.environ.get("VFUSE_PCH", "").strip()
    return value if value in ("0", "1") else "auto"


def files(cache_dir: Path, key: str) -> tuple[Path, Path, Path]:
    """(header, precompiled header, marker) of `key`."""
    header = cache_dir / f"vf_pch_{key}.h"
    return header, cache_dir / f"vf_pch_{key}.h.gch", cache_dir / f"vf_pch_{key}.ok"


class PchBuilds:
    """What one process knows of its compiler's precompiled preludes: the background builds it
    started (marker -> thread), the markers whose build failed here (not tried again), the
    marker checks already done (files' identities -> verdict), the compilers running, and the
    libraries it built per directory (`seen`). Owned by the toolchain (`toolchain.find_toolchain`
    gives every Toolchain of one compiler the same), so `prepare`'s thread is the one the first
    compile joins. The maps are under a lock (graphs compile from several threads); the files
    are guarded by each key's flock, so this is a memo: losing it costs time, never a library."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[str, threading.Thread] = {}
        self._failed: set[str] = set()
        self._checked: dict[str, tuple[tuple[tuple[int, ...], ...], str]] = {}
        self._running: set[subprocess.Popen[bytes]] = set()
        self._built: collections.Counter[str] = collections.Counter()
        self._atexit = False

    @property
    def started(self) -> bool:
        """Whether a background build was started in this process."""
        with self._lock:
            return bool(self._started)

    def built(self, cache_dir: Path) -> int:
        """Libraries built in `cache_dir` by this process."""
        with self._lock:
            return self._built[str(cache_dir)]

    def note_built(self, cache_dir: Path) -> None:
        with self._lock:
            self._built[str(cache_dir)] += 1

    def start(self, cache_dir: Path, key: str, tc: Compiler) -> bool:
        """Check, and build when missing, the header of `cache_dir` in a thread of its own (once
        per process): the caller traces and schedules meanwhile, on one core, and its first
        compile finds the header ready (`prelude_pch` waits for the thread). Only on two cores
        or more; whether a thread was started."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        header, gch, marker = files(cache_dir, key)
        if mode() == "0" or not eligible(PRELUDE) or cores < 2:
            return False
        args = (header, gch, marker, key, tc)
        with self._lock:
            if str(marker) in self._started or str(marker) in self._failed:
                return False
            thread = threading.Thread(target=self._background, args=args, name="vfuse-pch", daemon=True)
            self._started[str(marker)] = thread
        thread.start()
        return True

    def _background(self, header: Path, gch: Path, marker: Path, key: str, tc: Compiler) -> None:
        if self._verdict(header, gch, marker, key) is None and self._build_locked(header, gch, marker, key, tc) is None:
            self._fail(marker)

    def _fail(self, marker: Path) -> None:
        with self._lock:
            self._failed.add(str(marker))

    def prelude_pch(
        self, source: str, cache_dir: Path, key: str, tc: Compiler, seen: int, wait: bool = True
    ) -> Pch | None:
        """The precompiled prelude for `source` in `cache_dir` (which has seen `seen` libraries),
        built now when due, or by `start`'s thread: waited for if `wait` (a large source: the
        build is well under way, or pays anyway), else not taken while unfinished. None when the
        source does not start with the prelude, it is off, not due or not ready, or g++ rejects it."""
        want = mode()
        if want == "0" or not eligible(source):
            return None
        header, gch, marker = files(cache_dir, key)
        with self._lock:
            thread = self._started.get(str(marker))
        if thread is not None:
            if not wait and thread.is_alive():
                return None
            thread.join()
        verdict = self._verdict(header, gch, marker, key)
        with self._lock:
            due = (want == "1" or seen >= BUILD_AFTER) and str(marker) not in self._failed
        if verdict is None and due:
            verdict = self._build_locked(header, gch, marker, key, tc)
            if verdict is None:
                self._fail(marker)
        if verdict != "used":
            return None
        return Pch(header, len(PRELUDE), PRELUDE.count("\n"))

    def _build_locked(self, header: Path, gch: Path, marker: Path, key: str, tc: Compiler) -> str | None:
        """Build under the key's lock unless another process did meanwhile; the verdict, None
        when the build failed (the unit then compiles its full text)."""
        lock = open_lock(header.with_name(f"vf_pch_{key}.lock"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            verdict = self._verdict(header, gch, marker, key)
            if verdict is None:
                verdict = _build(header, gch, marker, key, tc, self._run)
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            os.close(lock)
        return verdict

    def _run(self, cmd: list[str]) -> None:
        """Run the compiler, killed at exit should this process end first (a `start` thread's)."""
        with self._lock:
            if not self._atexit:
                atexit.register(self.kill_running)
                self._atexit = True
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            with self._lock:
                self._running.add(proc)
            try:
                if proc.wait(timeout=600) != 0:
                    raise subprocess.CalledProcessError(proc.returncode, cmd)
            finally:
                if proc.poll() is None:
                    proc.kill()
                with self._lock:
                    self._running.discard(proc)

    def kill_running(self) -> None:
        with self._lock:
            running = list(self._running)
        for proc in running:
            proc.kill()

    def _verdict(self, header: Path, gch: Path, marker: Path, key: str) -> str | None:
        """The marker's verdict when it matches both files, else None (build again). The files
        are hashed again only when one of the three changed identity since they last matched."""
        ids = _identities(header, gch, marker)
        if ids is None:
            return None
        with self._lock:
            known = self._checked.get(str(marker))
        if known is not None and known[0] == ids:
            return known[1]
        text, lines = _read(marker), _digest_lines(header, gch)
        if text is None or lines is None or _identities(header, gch, marker) != ids:
            return None
        verdict = next((v for v in ("used", "rejected") if text == _marker_text(key, lines, v)), None)
        if verdict is not None:
            with self._lock:
                self._checked[str(marker)] = (ids, verdict)
        return verdict


def _build(
    header: Path, gch: Path, marker: Path, key: str, tc: Compiler, run: Callable[[list[str]], None]
) -> str | None:
    _evict(header.parent, marker)
    atomic_write(header, PRELUDE)
    fd, tmp = tempfile.mkstemp(dir=header.parent, prefix=gch.name, suffix=".tmp")
    os.close(fd)
    try:
        flags = [f for f in tc.flags if f != "-shared"]
        run([tc.cxx, *flags, "-x", "c++-header", str(header), "-o", tmp])
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, gch)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    verdict = "used" if _taken(header, gch, tc) else "rejected"
    lines = _digest_lines(header, gch)
    if lines is None:
        return None  # replaced meanwhile: not ours to vouch for
    atomic_write(marker, _marker_text(key, lines, verdict))
    return verdict


def _evict(cache_dir: Path, keep: Path) -> None:
    """Remove the headers of other keys built over `EVICT_AFTER_S` ago (~40 MB each: a changed
    prelude or compiler leaves its old ones behind). One still in use is built again when next
    due; a compile that had taken it finds the header gone and compiles the full text."""
    cutoff = time.time() - EVICT_AFTER_S
    for old in cache_dir.glob("vf_pch_*.ok"):
        try:
            if old == keep or old.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            stem = old.name.removesuffix(".ok")
            for suffix in (".ok", ".h.gch", ".h"):  # the marker first: never one naming missing files
                (cache_dir / f"{stem}{suffix}").unlink(missing_ok=True)
        except OSError:
            continue


def _taken(header: Path, gch: Path, tc: Compiler) -> bool:
    """Whether g++ takes `gch` for `header`: `-H` prints `! <path>.gch` for a valid one."""
    flags = [f for f in tc.flags if f != "-shared"]
    cmd = [tc.cxx, *flags, "-H", "-fsyntax-only", "-include", str(header), "-x", "c++", "/dev/null"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return res.returncode == 0 and f"! {gch}" in res.stderr.splitlines()


def _marker_text(key: str, lines: str, verdict: str) -> str:
    return f"{PCH_MAGIC}\nkey {key}\n{lines}verdict {verdict}\n"


def _identities(*paths: Path) -> tuple[tuple[int, ...], ...] | None:
    """(device, inode, size, mtime) of each path, None when one is missing or not a regular file."""
    ids = []
    for p in paths:
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        ids.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(ids)


def _digest_lines(header: Path, gch: Path) -> str | None:
    """The marker's lines naming both files, or None when the header is not the prelude or the
    precompiled one cannot be read (neither followed through a symlink)."""
    text = _read(header)
    if text != PRELUDE:
        return None
    try:
        fd = os.open(gch, _OPEN_FLAGS)
    except OSError:
        return None
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return f"header {hashlib.sha256(text.encode()).hexdigest()}\ngch {size} {digest}\n"


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read().decode(errors="replace")
