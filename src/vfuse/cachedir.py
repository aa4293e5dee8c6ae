"""On-disk cache directories that only their user can write.

vfuse keeps compiled kernels and the cpu target's measurements under one directory (default
~/.cache/vfuse). Loading a kernel runs its code, so a directory anyone else can write to is not
trusted: the directories vfuse creates are 0700, and an existing one owned by another user or
writable by group/others is refused (callers then use a private per-process directory instead).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH


class CacheDirWarning(UserWarning):
    """The cache directory was not used (unsafe or not writable); kernels go to a private temp dir."""


def make_private_dir(path: Path) -> None:
    """Create `path` and its missing parents with mode 0700 (existing ones are left as they are);
    raises OSError when it cannot."""
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another process (checked by dir_problem, not trusted here)
        os.chmod(d, 0o700)  # a umask may have removed owner bits; it never adds others'


def dir_problem(path: Path) -> str | None:
    """Why `path` must not hold code this process will load, or None when it may: it must be a
    directory owned by this user and not writable by group or others."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & UNSAFE_MODE:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def usable_dir(path: Path) -> Path | None:
    """`path`, created 0700 when missing, or None (after a CacheDirWarning naming it and why) when
    it is unsafe or cannot be created."""
    try:
        make_private_dir(path)
    except OSError as e:
        problem: str | None = f"cannot be created ({e.strerror})"
    else:
        problem = dir_problem(path)
    if problem is None:
        return path
    warn_unused(path, problem)
    return None


def warn_unused(path: Path, problem: str) -> None:
    # The default warnings filter shows each (message, call site) once per process.
    warnings.warn(
        f"vfuse: cache directory {path} {problem}; not using it (kernels are compiled into a private "
        f"temporary directory for this process). Use a directory only you can write (mode 0700), "
        f"or set VFUSE_CACHE_DIR.",
        CacheDirWarning,
        stacklevel=3,
    )


@functools.cache
def private_dir() -> Path:
    """A 0700 directory of this process's own, removed at exit (loaded libraries stay mapped)."""
    path = Path(tempfile.mkdtemp(prefix="vfuse-kernels-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file and a rename, so a reader (or a concurrent
    writer) never sees half a file; the temp file is removed when anything fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: object) -> None:
    """`payload` as JSON, written atomically (`write_bytes_atomic`)."""
    write_bytes_atomic(path, json.dumps(payload, indent=1).encode())
