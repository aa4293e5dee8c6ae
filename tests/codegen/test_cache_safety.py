"""Kernel cache safety: private directories, markers bound to their key, no symlink following,
truncated libraries, CPU fingerprint, stale temp files, read-only and shared use."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vfuse.cachedir import CacheDirWarning
from vfuse.codegen.cpp import toolchain
from vfuse.codegen.cpp.cache import STALE_TMP_S, entry, marker_text
from vfuse.codegen.cpp.toolchain import Toolchain, build_library, cache_key, find_toolchain, load_library
from vfuse.targets.cpu import isa_of

SOURCE = 'extern "C" int vf_answer(int x) { return x + %d; }\n'
REPO = Path(__file__).resolve().parents[2]


def _answer(lib: object) -> int:
    return lib.vf_answer(1)  # type: ignore[attr-defined]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run_python(code: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, text=True, stdout=subprocess.PIPE, **kw
    )


def _wrapper(path: Path, body: str) -> str:
    """A compiler that runs `body` (shell) and then the real compiler."""
    path.write_text(f'#!/bin/sh\n{body}\nexec {find_toolchain().cxx} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_directories_it_creates_are_private(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "b"
    assert _answer(load_library(SOURCE % 1, cache, find_toolchain())) == 2
    assert _mode(tmp_path / "a") == 0o700 and _mode(cache) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_directory_others_can_write_is_not_used(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.warns(CacheDirWarning, match=f"{shared} is writable by group or others"):
        lib = load_library(SOURCE % 2, shared, find_toolchain())
    assert _answer(lib) == 3 and list(shared.iterdir()) == []


def test_directory_of_another_user_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tc = find_toolchain()
    so = build_library(SOURCE % 3, tmp_path, tc)  # a valid entry, but in someone else's directory
    monkeypatch.setattr(os, "getuid", lambda: so.stat().st_uid + 1)
    with pytest.warns(CacheDirWarning, match="is owned by uid"):
        assert build_library(SOURCE % 3, tmp_path, tc).parent != tmp_path


def _planted(tmp_path: Path, tc: Toolchain) -> tuple[bytes, Path]:
    """A library whose constructor creates a file (its path is returned) and whose vf_answer lies."""
    witness = tmp_path / "constructor_ran"
    src = (
        "#include <cstdio>\n"
        f'__attribute__((constructor)) static void planted() {{ fclose(fopen("{witness}", "w")); }}\n'
        'extern "C" int vf_answer(int x) { return 666; }\n'
    )
    return build_library(src, tmp_path / "attacker", tc).read_bytes(), witness


@pytest.mark.parametrize("marker", ["sha256 only", "another key"])
def test_planted_library_is_rebuilt_without_running_it(tmp_path: Path, marker: str) -> None:
    tc = find_toolchain()
    planted, witness = _planted(tmp_path, tc)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    key = cache_key(SOURCE % 4, tc)
    so, ok = entry(cache, key)
    so.write_bytes(planted)
    other = cache_key(SOURCE % 5, tc)
    ok.write_text(hashlib.sha256(planted).hexdigest() if marker == "sha256 only" else marker_text(other, planted))
    assert _answer(load_library(SOURCE % 4, cache, tc)) == 5
    assert not witness.exists()


def test_symlinked_lock_leaves_its_target_alone(tmp_path: Path) -> None:
    tc = find_toolchain()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    lock = cache / f"vf_{cache_key(SOURCE % 6, tc)}.lock"
    lock.symlink_to(victim)
    assert _answer(load_library(SOURCE % 6, cache, tc)) == 7
    assert victim.read_text() == "precious" and not lock.is_symlink() and _mode(lock) == 0o600


def test_symlinked_library_and_marker_are_replaced(tmp_path: Path) -> None:
    tc = find_toolchain()
    elsewhere = build_library(SOURCE % 7, tmp_path / "elsewhere", tc)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    so, ok = entry(cache, cache_key(SOURCE % 7, tc))
    so.symlink_to(elsewhere)
    ok.symlink_to(elsewhere.with_suffix(".ok"))
    assert build_library(SOURCE % 7, cache, tc) == so
    assert not so.is_symlink() and not ok.is_symlink()


def test_truncated_library_with_a_matching_marker_does_not_crash(tmp_path: Path) -> None:
    """dlopen of a truncated library maps past the end of the file: SIGBUS. Run where that
    cannot take the test process down; one marker as the old format wrote it, one as this one
    does (a crash of the machine can leave both names pointing at what was flushed)."""
    tc = find_toolchain()
    for i, marker in enumerate(("old", "new")):
        so = build_library(SOURCE % (10 + i), tmp_path / marker, tc)
        cut = so.read_bytes()[: so.stat().st_size // 2]
        so.write_bytes(cut)
        key = cache_key(SOURCE % (10 + i), tc)
        so.with_suffix(".ok").write_text(hashlib.sha256(cut).hexdigest() if marker == "old" else marker_text(key, cut))
    child = _run_python(f"""
        from pathlib import Path
        from vfuse.codegen.cpp.toolchain import find_toolchain, load_library
        for i, marker in enumerate(("old", "new")):
            print(load_library({SOURCE!r} % (10 + i), Path({str(tmp_path)!r}) / marker, find_toolchain()).vf_answer(1))
    """)
    out, _ = child.communicate(timeout=300)
    assert (child.returncode, out.split()) == (0, ["11", "12"])


def test_cpu_fingerprint_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    tc = find_toolchain()
    here = cache_key("x", tc)
    monkeypatch.setattr(toolchain, "isa_fingerprint", lambda: "another cpu")
    assert cache_key("x", tc) != here


def test_cpu_fingerprint_covers_model_and_flags_not_clock() -> None:
    cpu = {"model name": "Some CPU", "flags": "fpu sse2 avx2", "cpu MHz": "2400.0", "bogomips": "4800"}
    assert isa_of(cpu) != isa_of(cpu | {"flags": "fpu sse2 avx2 avx512f"})
    assert isa_of(cpu) != isa_of(cpu | {"model name": "Other CPU"})
    assert isa_of(cpu) == isa_of(cpu | {"cpu MHz": "3100.5", "bogomips": "6200"})


def test_stale_temp_files_are_swept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = time.time() - 2 * STALE_TMP_S
    names = ("vf_aa.so.tmp", "vf_bb.cppq1w2.tmp", "vf_cc.so.tmp", "notes.tmp")
    for name in names:
        (cache / name).write_bytes(b"x")
    for name in ("vf_aa.so.tmp", "vf_bb.cppq1w2.tmp", "notes.tmp"):
        os.utime(cache / name, (old, old))
    assert _answer(load_library(SOURCE % 8, cache, find_toolchain())) == 9
    assert sorted(p.name for p in cache.glob("*.tmp")) == ["notes.tmp", "vf_cc.so.tmp"]


def _make_read_only(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode 0500, and (as root ignores modes) no file creation in it through os.open either."""
    real_open = os.open

    def open_(path: object, flags: int, *args: object, **kw: object) -> int:
        if flags & os.O_CREAT and Path(str(path)).parent == cache:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    cache.chmod(0o500)


def test_read_only_directory_serves_hits_and_builds_misses_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tc = find_toolchain()
    cache = tmp_path / "cache"
    hit = build_library(SOURCE % 20, cache, tc)
    _make_read_only(cache, monkeypatch)
    try:
        before = sorted(cache.iterdir())
        assert load_library(SOURCE % 20, cache, tc)._name == str(hit)  # type: ignore[attr-defined]
        with pytest.warns(CacheDirWarning, match="cannot be written"):
            lib = load_library(SOURCE % 21, cache, tc)
        assert _answer(lib) == 22 and sorted(cache.iterdir()) == before
    finally:
        cache.chmod(0o700)


def test_three_processes_build_one_library_once(tmp_path: Path) -> None:
    log, cache = tmp_path / "compiles.log", tmp_path / "cache"
    cxx = _wrapper(tmp_path / "cxx", f"echo run >> {log}; sleep 0.5")
    code = f"""
        import time
        from pathlib import Path
        from vfuse.codegen.cpp.toolchain import Toolchain, load_library
        ready = Path({str(tmp_path)!r}) / "ready"
        ready.mkdir(exist_ok=True)
        (ready / str(__import__("os").getpid())).touch()
        while len(list(ready.iterdir())) < 3:  # start together, after the slow imports
            time.sleep(0.01)
        print(load_library({SOURCE % 30!r}, Path({str(cache)!r}), Toolchain({cxx!r}, "wrapped")).vf_answer(1))
    """
    children = [_run_python(code) for _ in range(3)]
    outs = [c.communicate(timeout=300)[0].split() for c in children]
    assert [c.returncode for c in children] == [0, 0, 0] and outs == [["31"]] * 3
    assert log.read_text().split() == ["run"]


def test_compile_killed_midway_leaves_the_cache_usable(tmp_path: Path) -> None:
    hang, started, pidfile, cache = (tmp_path / n for n in ("hang", "started", "pid", "cache"))
    hang.touch()
    cxx = _wrapper(tmp_path / "cxx", f"if [ -e {hang} ]; then echo $$ > {pidfile}; touch {started}; sleep 120; fi")
    child = _run_python(f"""
        from pathlib import Path
        from vfuse.codegen.cpp.toolchain import Toolchain, build_library
        build_library({SOURCE % 40!r}, Path({str(cache)!r}), Toolchain({cxx!r}, "wrapped"))
    """)
    try:
        while not started.exists() and child.poll() is None:
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)  # its compiler (sleeping) lives on and must hold no lock
        child.wait(timeout=60)
        hang.unlink()
        assert _answer(load_library(SOURCE % 40, cache, Toolchain(cxx, "wrapped"))) == 41
        assert len(list(cache.glob("*.so.tmp"))) == 1  # the killed compile's, too young to be swept
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_truncated_source_without_marker_is_rebuilt(tmp_path: Path) -> None:
    tc = find_toolchain()
    so = build_library(SOURCE % 50, tmp_path, tc)
    cpp = so.with_suffix(".cpp")
    cpp.write_text(cpp.read_text()[:10])
    so.with_suffix(".ok").unlink()
    assert _answer(load_library(SOURCE % 50, tmp_path, tc)) == 51 and cpp.read_text() == SOURCE % 50
