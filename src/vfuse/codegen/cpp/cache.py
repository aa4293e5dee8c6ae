"""The kernel cache's files: one entry per key, validated right before it is loaded.

An entry is `vf_<key>.cpp` (the source, kept for diagnostics), `vf_<key>.so`, `vf_<key>.ok` and
`vf_<key>.lock`. The marker is written last and names the key, the library's size and its
sha256; a library is loaded only when the marker matches it, read through descriptors that do not
follow symlinks, and when the ELF file holds every segment it maps (so a truncated library is
rebuilt instead of raising SIGBUS). Files are published with os.replace, so a published library
is never written in place; the directory is this user's alone (vfuse.cachedir), which leaves the
time between this check and dlopen open to nobody but the same user.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import struct
import tempfile
import time
from pathlib import Path

MARKER_MAGIC = "vfuse-kernel 2"
STALE_TMP_S = 3600.0  # a compile is killed after 600 s, so a temp file this old is an orphan
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
_PT_LOAD = 1


def entry(cache_dir: Path, key: str) -> tuple[Path, Path]:
    """(library, marker) paths of `key`."""
    return cache_dir / f"vf_{key}.so", cache_dir / f"vf_{key}.ok"


def _read_nofollow(path: Path) -> bytes | None:
    """The bytes of regular file `path`, or None when it is missing, a symlink or not a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN_FLAGS)  # O_NONBLOCK: a FIFO must not hang us
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read()


def marker_text(key: str, library: bytes) -> str:
    digest = hashlib.sha256(library).hexdigest()
    return f"{MARKER_MAGIC}\nkey {key}\nsize {len(library)}\nsha256 {digest}\n"


def elf_fits(data: bytes) -> bool:
    """Whether `data` is an ELF file that holds every byte its loadable segments map from it.
    dlopen maps segments past the end of a truncated file and the first touch raises SIGBUS."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    end = "<" if data[5] == 1 else ">"
    wide = data[4] == 2
    phoff, phentsize, phnum = (
        struct.unpack_from(end + "Q", data, 32)[0] if wide else struct.unpack_from(end + "I", data, 28)[0],
        *struct.unpack_from(end + "HH", data, 54 if wide else 42),
    )
    if phentsize < (56 if wide else 32) or phoff + phnum * phentsize > len(data):
        return False
    for i in range(phnum):
        at = phoff + i * phentsize
        if wide:
            kind, _, offset, _, _, filesz = struct.unpack_from(end + "IIQQQQ", data, at)
        else:
            kind, offset, _, _, filesz = struct.unpack_from(end + "IIIII", data, at)
        if kind == _PT_LOAD and offset + filesz > len(data):
            return False
    return True


def validated(so: Path, marker: Path, key: str) -> bool:
    """Whether `so` may be loaded as the library of `key`: neither file is a symlink, the marker is
    this format and names this key, the library's size and sha256 match it, and its ELF segments
    lie within the file. Reads the whole library (~0.1 ms per 100 KB)."""
    text = _read_nofollow(marker)
    library = _read_nofollow(so) if text is not None else None
    if library is None or text is None:
        return False
    return text.decode(errors="replace") == marker_text(key, library) and elf_fits(library)


def publish(tmp: Path, so: Path, marker: Path, key: str) -> None:
    """Move the freshly built library `tmp` into place, then write its marker (last, so a reader
    never takes a marker for a library that is not all there). Both are flushed before the rename
    so that a crash of the machine cannot leave a named but empty file."""
    fd = os.open(tmp, os.O_RDONLY | _OPEN_FLAGS)
    with open(fd, "rb") as f:
        library = f.read()
        os.fsync(fd)
    os.replace(tmp, so)
    atomic_write(marker, marker_text(key, library))


def atomic_write(path: Path, text: str) -> None:
    """Write `path` through a private temp file (mkstemp: O_EXCL | O_NOFOLLOW, mode 0600) and
    os.replace, which replaces a symlink at `path` rather than writing through it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_lock(path: Path) -> int:
    """A descriptor of lock file `path` (mode 0600), never truncating or following a symlink: a
    symlink found there is removed and a regular file made in its place."""
    flags = os.O_RDWR | os.O_CREAT | _OPEN_FLAGS
    try:
        return os.open(path, flags, 0o600)
    except OSError:
        if not path.is_symlink():
            raise
    path.unlink(missing_ok=True)
    return os.open(path, flags, 0o600)


def sweep_stale(cache_dir: Path, max_age_s: float = STALE_TMP_S) -> int:
    """Remove the temp files of compiles that were killed (older than `max_age_s`); their count."""
    return _sweep(cache_dir, max_age_s)[0]


def _sweep(cache_dir: Path, max_age_s: float) -> tuple[int, int]:
    """(stale temp files removed, libraries' markers found) in `cache_dir`."""
    cutoff, removed, libraries = time.time() - max_age_s, 0, 0
    with os.scandir(cache_dir) as entries:
        for e in entries:
            if not e.name.startswith("vf_"):
                continue
            if e.name.endswith(".ok") and not e.name.startswith("vf_pch_"):
                libraries += 1
            if not e.name.endswith(".tmp"):
                continue
            try:
                if e.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(e.path)
                    removed += 1
            except OSError:
                continue  # removed meanwhile by another process
    return removed, libraries


@functools.lru_cache(maxsize=64)
def sweep_once(cache_dir: str) -> int:
    """sweep_stale at most once per process and directory: it lists the directory, which holds
    four files per kernel ever built, so it runs on the first compile, not on every cache hit.
    The number of markers it found (how much the directory is used: `pch.py` counts them)."""
    try:
        return _sweep(Path(cache_dir), STALE_TMP_S)[1]
    except OSError:
        return 0  # an unreadable directory fails later with a clearer error
