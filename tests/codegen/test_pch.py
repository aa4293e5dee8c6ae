"""The precompiled prelude (codegen/cpp/pch.py): the same assembly as the full text, built once,
used only while its marker matches, and a damaged, planted or rejected one costs time, never a
wrong library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, target

from vfuse.codegen.cpp import pch, render, toolchain
from vfuse.codegen.cpp.toolchain import cache_key, find_toolchain
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.schedule import build


def _graph(n: int = 13) -> Graph:
    """A GEMM with an epilogue (a template), a row kernel and pointwise kernels, at odd sizes."""
    b = GraphBuilder()
    x, w, y = inputs(b, ((n, 37), DType.F32), ((37, 29), DType.F32), ((n, 29), DType.F32))
    mm = b.add(Op.MATMUL, [x, w])
    h = b.add(Op.ADD, [b.add(Op.EXP, [b.add(Op.NEG, [mm])]), y])
    total = b.add(Op.SUM, [h], axes=(1,), keepdim=True)
    return b.build([b.add(Op.DIV, [h, total]), b.add(Op.ERF, [y])])


def _check(n: int, cache: Path) -> None:
    x, w, y = torch.randn(n, 37), torch.randn(37, 29), torch.randn(n, 29)
    out, erf = executor(_graph(n), cache_dir=cache)([x, w, y])
    h = (-(x @ w)).exp() + y
    torch.testing.assert_close(out, h / h.sum(1, keepdim=True))
    torch.testing.assert_close(erf, torch.erf(y))


def _pch(cache: Path, monkeypatch: pytest.MonkeyPatch) -> pch.Pch:
    monkeypatch.setenv("VFUSE_PCH", "1")
    tc = find_toolchain()
    made = tc.pch.prelude_pch(pch.PRELUDE, cache, cache_key(pch.KEY_TEXT, tc), tc, seen=0)
    assert made is not None, "g++ should take its own precompiled header"
    return made


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache with a precompiled prelude for the tests that only read it (built once: ~1.5 s)."""
    cache = tmp_path_factory.mktemp("pch")
    with pytest.MonkeyPatch.context() as mp:
        _pch(cache, mp)
    return cache


def _assembly(source: str, tmp: Path, extra: tuple[str, ...]) -> list[str]:
    cpp, asm = tmp / "unit.cpp", tmp / "unit.s"
    cpp.write_text(source)
    tc = find_toolchain()
    flags = [f for f in tc.flags if f != "-shared"]
    subprocess.run([tc.cxx, *flags, *extra, "-S", "-x", "c++", str(cpp), "-o", str(asm)], check=True, timeout=300)
    return [line for line in asm.read_text().splitlines() if not line.lstrip().startswith((".file", ".ident"))]


def test_same_assembly_through_the_header(shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _pch(shared, monkeypatch)
    source = render(build(plan_fusion(_graph(), target()), target()))
    plain = _assembly(source, tmp_path, ())
    assert plain == _assembly(made.unit(source, "vf_x.cpp"), tmp_path, made.flags())
    assert len(plain) > 200


def test_libraries_build_through_it_and_match_eager(
    shared: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    used: list[bool] = []
    real = toolchain._compile_units
    monkeypatch.setattr(
        toolchain, "_compile_units", lambda p, so, tc, h: used.append(h is not None) or real(p, so, tc, h)
    )
    monkeypatch.setenv("VFUSE_CXX_UNITS", "2")
    for n in (1, 13):  # split in two units, then one
        monkeypatch.setenv("VFUSE_CXX_UNITS", "2" if n == 1 else "1")
        _check(n, shared)
    assert used == [True, True]
    assert not list(shared.glob("*.tmp"))


def test_not_built_for_a_fresh_directory_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold one-graph run would pay ~1.4 s of CPU to save ~0.35 s."""
    monkeypatch.delenv("VFUSE_PCH", raising=False)
    _check(3, tmp_path)
    assert not list(tmp_path.glob("vf_pch_*"))
    monkeypatch.setenv("VFUSE_PCH", "0")
    tc = find_toolchain()
    assert tc.pch.prelude_pch(pch.PRELUDE, tmp_path, "k", tc, seen=100) is None


def _copy(shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pch.Pch:
    """The shared cache's header, copied into `tmp_path` (the key does not name the directory)."""
    for f in shared.glob("vf_pch_*"):
        shutil.copy(f, tmp_path / f.name)
    return _pch(tmp_path, monkeypatch)


@pytest.mark.parametrize("damage", ["truncated", "replaced", "header", "symlink", "no marker"])
def test_damaged_header_is_rebuilt(damage: str, shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _copy(shared, tmp_path, monkeypatch)
    gch, marker = made.header.with_name(made.header.name + ".gch"), made.header.with_suffix(".ok")
    good = gch.read_bytes()
    if damage == "truncated":
        gch.write_bytes(good[: len(good) // 2])
    elif damage == "replaced":  # same size, other bytes
        gch.write_bytes(good[:4096] + bytes(len(good) - 4096))
    elif damage == "header":
        made.header.write_text(pch.PRELUDE + "#define exp 0\n")
    elif damage == "symlink":
        (tmp_path / "elsewhere.gch").write_bytes(good)
        gch.unlink()
        gch.symlink_to(tmp_path / "elsewhere.gch")
    else:
        marker.unlink()
    again = _pch(tmp_path, monkeypatch)
    assert made.header.read_text() == pch.PRELUDE and not gch.is_symlink()
    assert "verdict used" in marker.read_text() and again == made


def test_planted_header_cannot_make_a_wrong_library(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .gch g++ rejects, or fails on, under a marker that vouches for it: the unit reads the
    prelude's text (g++ ignores an invalid one) or is compiled again as the full text."""
    made = _copy(shared, tmp_path, monkeypatch)
    gch, marker = made.header.with_name(made.header.name + ".gch"), made.header.with_suffix(".ok")
    gch.write_bytes(b"gpch.013" + bytes(4096))
    lines = pch._digest_lines(made.header, gch)
    assert lines is not None
    key = marker.name.removeprefix("vf_pch_").removesuffix(".ok")
    marker.write_text(pch._marker_text(key, lines, "used"))
    _check(7, tmp_path)


def test_rejected_header_is_not_used_and_old_ones_are_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pch, "_taken", lambda *a: False)
    monkeypatch.setenv("VFUSE_PCH", "1")
    tc = find_toolchain()
    for stem, age in (("old", 2 * pch.EVICT_AFTER_S), ("young", 0)):  # other keys' headers
        for suffix in (".ok", ".h", ".h.gch"):
            (tmp_path / f"vf_pch_{stem}{suffix}").write_text("x")
            os.utime(tmp_path / f"vf_pch_{stem}{suffix}", (time.time() - age,) * 2)
    assert tc.pch.prelude_pch(pch.PRELUDE, tmp_path, "k1", tc, seen=0) is None
    assert "verdict rejected" in (tmp_path / "vf_pch_k1.ok").read_text()
    assert sorted(p.name for p in tmp_path.glob("vf_pch_[oy]*")) == [
        "vf_pch_young.h",
        "vf_pch_young.h.gch",
        "vf_pch_young.ok",
    ]
    monkeypatch.setattr(pch, "_build", lambda *a: pytest.fail("a rejected header is not built again"))
    assert tc.pch.prelude_pch(pch.PRELUDE, tmp_path, "k1", tc, seen=0) is None


def test_concurrent_builders_build_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFUSE_PCH", "1")
    builds: list[int] = []
    real = pch._build
    monkeypatch.setattr(pch, "_build", lambda *a: builds.append(1) or real(*a))
    tc = find_toolchain()
    got: list[pch.Pch | None] = []
    threads = [
        threading.Thread(target=lambda: got.append(tc.pch.prelude_pch(pch.PRELUDE, tmp_path, "k2", tc, seen=0)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == [1] and len(got) == 3 and all(g is not None for g in got)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="built in the background on two cores or more")
def test_prepared_directory_has_it_for_the_first_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry point's `prepare` builds it while the graph is traced: a cold one-graph compile takes it."""
    monkeypatch.delenv("VFUSE_PCH", raising=False)
    used: list[bool] = []
    real = toolchain._compile_units
    monkeypatch.setattr(
        toolchain, "_compile_units", lambda p, so, tc, h: used.append(h is not None) or real(p, so, tc, h)
    )
    monkeypatch.setattr(toolchain, "UNIT_BYTES", 1)  # as for a large source: waits for the build
    toolchain.prepare(tmp_path)
    toolchain.prepare(tmp_path)  # once per process and directory
    assert len([t for t in threading.enumerate() if t.name == "vfuse-pch"]) <= 1
    monkeypatch.setenv("VFUSE_CXX_UNITS", "1")
    _check(11, tmp_path)
    assert used == [True]


def test_process_ending_during_the_build_leaves_the_cache_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that exits while its background build runs kills the compiler; the header is
    built again by the next process that wants it."""
    code = (
        "import sys\nfrom pathlib import Path\nfrom vfuse.codegen.cpp import pch, toolchain\n"
        f"toolchain.prepare(Path({str(tmp_path)!r}))\nsys.exit(0 if toolchain.find_toolchain().pch.started else 3)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not list(tmp_path.glob("vf_pch_*.ok"))
    _pch(tmp_path, monkeypatch)


def test_builds_belong_to_the_compiler_not_the_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One PchBuilds per compiler (prepare's thread is the one a compile joins), none shared with
    a Toolchain made by hand, and no part of a toolchain's identity."""
    one, two = find_toolchain(), find_toolchain()
    assert one.pch is two.pch and one == two
    own = toolchain.Toolchain(one.cxx, one.version, one.flags)
    assert own.pch is not one.pch and own == one
    monkeypatch.setenv("VFUSE_PCH", "1")
    assert own.pch.prelude_pch(pch.PRELUDE, tmp_path, "k3", own, seen=0) is not None
    assert own.pch.built(tmp_path) == 0 and not own.pch.started
