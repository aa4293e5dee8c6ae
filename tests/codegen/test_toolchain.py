"""Kernel cache: content-hash keys, atomic writes, corruption detection, locking, missing compiler."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, target

from vfuse.codegen.cpp import render
from vfuse.codegen.cpp.toolchain import (
    CompileError,
    CompilerNotFound,
    build_library,
    cache_key,
    find_toolchain,
    load_library,
)
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule import build

SOURCE = 'extern "C" int vf_answer(int x) { return x + %d; }\n'


def _answer(lib: object) -> int:
    return lib.vf_answer(1)  # type: ignore[attr-defined]


def test_cache_hit_reuses_the_library(tmp_path: Path) -> None:
    tc = find_toolchain()
    so = build_library(SOURCE % 41, tmp_path, tc)
    stamp = so.stat().st_mtime_ns
    assert build_library(SOURCE % 41, tmp_path, tc) == so and so.stat().st_mtime_ns == stamp
    assert build_library(SOURCE % 40, tmp_path, tc) != so  # another source, another key


def test_truncated_library_is_rebuilt(tmp_path: Path) -> None:
    tc = find_toolchain()
    so = build_library(SOURCE % 42, tmp_path, tc)
    so.write_bytes(so.read_bytes()[:100])  # a crash half-way through writing it
    assert _answer(load_library(SOURCE % 42, tmp_path, tc)) == 43


def test_library_without_marker_is_rebuilt(tmp_path: Path) -> None:
    tc = find_toolchain()
    so = build_library(SOURCE % 43, tmp_path, tc)
    so.with_suffix(".ok").unlink()
    so.write_bytes(b"garbage")
    assert _answer(load_library(SOURCE % 43, tmp_path, tc)) == 44


def test_concurrent_builds_of_one_source(tmp_path: Path) -> None:
    tc = find_toolchain()
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: build_library(SOURCE % 44, tmp_path, tc), range(4)))
    assert len(set(paths)) == 1
    assert sorted(p.suffix for p in tmp_path.iterdir() if p.name.startswith(paths[0].stem)) == [
        ".cpp",
        ".lock",
        ".ok",
        ".so",
    ]


def test_key_covers_compiler_and_flags() -> None:
    tc = find_toolchain()
    other = type(tc)(tc.cxx, tc.version, (*tc.flags, "-DX"))
    assert cache_key("x", tc) != cache_key("x", other)


def test_compile_error_reports_diagnostics(tmp_path: Path) -> None:
    with pytest.raises(CompileError, match="error"):
        build_library("this is not C++", tmp_path, find_toolchain())


def test_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CompilerNotFound, match="nonexistent"):
        find_toolchain("/nonexistent/g++")
    monkeypatch.setenv("VFUSE_CXX", "/nonexistent/g++")
    b = GraphBuilder()
    (x,) = inputs(b, ((8,), DType.F32))
    graph = b.build([b.add(Op.EXP, [x])])
    with pytest.raises(CompilerNotFound):
        executor(graph, cache_dir=tmp_path)


def test_executor_survives_a_corrupted_cache(tmp_path: Path) -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((8,), DType.F32))
    graph = b.build([b.add(Op.NEG, [b.add(Op.EXP, [x])])])
    # Built (not loaded: truncating a mapped library would crash this process) then corrupted,
    # as a crash or a full disk in another process would leave it.
    so = build_library(render(build(plan_fusion(graph, target()), target())), tmp_path, find_toolchain())
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])
    xv = torch.randn(8)
    torch.testing.assert_close(executor(graph, cache_dir=tmp_path)([xv])[0], -xv.exp())


def _fake_compiler(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_compiler_version_is_asked_again_when_the_compiler_changes(tmp_path: Path) -> None:
    cxx = _fake_compiler(tmp_path / "cxx", "echo fake-cc 1.0")
    assert find_toolchain(cxx).version == "fake-cc 1.0"
    assert find_toolchain(cxx).version == "fake-cc 1.0"  # remembered for the same file
    _fake_compiler(tmp_path / "cxx", "echo fake-cc 2.0.1")  # replaced: another size and mtime
    assert find_toolchain(cxx).version == "fake-cc 2.0.1"


def test_compiler_that_fails_is_not_remembered(tmp_path: Path) -> None:
    cxx = _fake_compiler(tmp_path / "cxx", "exit 3")
    with pytest.raises(CompilerNotFound, match="does not run"):
        find_toolchain(cxx)
    _fake_compiler(tmp_path / "cxx", "echo fake-cc 3.0")
    assert find_toolchain(cxx).version == "fake-cc 3.0"
