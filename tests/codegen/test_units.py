"""A program's C++ split into units compiled in parallel (codegen/cpp/units.py): the same
results as one unit, every kernel defined once, and a failed split falls back to one unit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, target

from vfuse.codegen.cpp import render, toolchain
from vfuse.codegen.cpp.function import SIGNATURE
from vfuse.codegen.cpp.units import ENTRIES, HIDDEN, PART, _blocks, split
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.schedule import build


def _graph() -> Graph:
    """A GEMM with an epilogue (a template part), a row kernel and pointwise kernels, at odd sizes."""
    b = GraphBuilder()
    x, w, y = inputs(b, ((13, 37), DType.F32), ((37, 29), DType.F32), ((13, 29), DType.F32))
    mm = b.add(Op.MATMUL, [x, w])
    h = b.add(Op.ADD, [b.add(Op.EXP, [b.add(Op.NEG, [mm])]), y])
    total = b.add(Op.SUM, [h], axes=(1,), keepdim=True)
    return b.build([b.add(Op.DIV, [h, total]), b.add(Op.TANH, [y])])


def _source(graph: Graph) -> str:
    return render(build(plan_fusion(graph, target()), target()))


def test_split_defines_each_kernel_once_and_declares_them_for_the_entries() -> None:
    source = _source(_graph())
    kernels = [line[len(PART) :] for line in source.splitlines() if line.startswith(PART)]
    names = set(kernels) - {ENTRIES}
    assert len(names) >= 2 and kernels[-1] == ENTRIES
    units = split(source, 2)
    assert units is not None and len(units) == 2
    head = source[: source.index(PART)]
    assert all(u.startswith(head) for u in units)
    for name in names:
        definition = f"{HIDDEN}{name}(void* const* bufs, char* arena, const int64_t* seeds, int nt) {{"
        assert sum(u.count(definition) for u in units) == 1, name
        assert all(f"static void {name}(" not in u for u in units)
    assert sum(u.count('extern "C" int') for u in units) == source.count('extern "C" int')


@pytest.mark.parametrize(
    "source",
    [
        'extern "C" int vf_answer(int x) { return x; }\n',  # no marks: an older renderer
        f"head\n{PART}k0\nstatic void k0(int) {{}}\n{PART}{ENTRIES}\nentries\n",  # one kernel
        f"head\n{PART}k0\nint a;\n{PART}k1\nint b;\n{PART}{ENTRIES}\nentries\n",  # no kernel functions
    ],
)
def test_split_declines_what_it_cannot_split(source: str) -> None:
    assert split(source, 2) is None


def test_split_build_matches_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFUSE_CXX_UNITS", "3")
    built: list[int] = []
    compile_units = toolchain._compile_units
    monkeypatch.setattr(
        toolchain, "_compile_units", lambda pieces, *a: built.append(len(pieces)) or compile_units(pieces, *a)
    )
    x, w, y = torch.randn(13, 37), torch.randn(37, 29), torch.randn(13, 29)
    out, tanh = executor(_graph(), cache_dir=tmp_path)([x, w, y])
    h = (-(x @ w)).exp() + y
    torch.testing.assert_close(out, h / h.sum(1, keepdim=True))
    torch.testing.assert_close(tanh, y.tanh())
    assert built and built[0] >= 2
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no scratch left


def test_a_failed_split_falls_back_to_one_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit without its kernel (a split that went wrong) fails the link; the whole text is
    then compiled as one unit and runs."""
    monkeypatch.setenv("VFUSE_CXX_UNITS", "2")
    real = toolchain.split
    monkeypatch.setattr(toolchain, "split", lambda source, n: (real(source, n) or [])[-1:])
    x, w, y = torch.randn(13, 37), torch.randn(37, 29), torch.randn(13, 29)
    out, _ = executor(_graph(), cache_dir=tmp_path)([x, w, y])
    h = (-(x @ w)).exp() + y
    torch.testing.assert_close(out, h / h.sum(1, keepdim=True))
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _part(name: str, block: str, size: int) -> str:
    """A kernel's part: a guarded helper block of `size` bytes (nested #if inside), then its function."""
    body = f"#if 1\nint {block.lower()}_x;\n#endif\n" + "/" * size + "\n"
    return f"{PART}{name}\n#ifndef {block}\n#define {block}\n{body}#endif\nstatic void {name}{SIGNATURE} {{}}\n"


def test_blocks_are_the_outermost_guards_with_their_nested_ifs() -> None:
    text = _part("k0", "VG_GEMM_A", 500).split("\n", 1)[1] + "#ifndef VG_B\n#define VG_B\n#ifdef X\n#endif\n#endif\n"
    part = _blocks(text)
    assert set(part.blocks) == {"VG_GEMM_A", "VG_B"}
    assert part.own == len(f"static void k0{SIGNATURE} {{}}\n")
    assert part.blocks["VG_B"] == len("#ifndef VG_B\n#define VG_B\n#ifdef X\n#endif\n#endif\n")


def test_kernels_sharing_a_guarded_block_share_a_unit() -> None:
    """Two GEMM instances, each called by two kernels: each instance is compiled in one unit,
    and each unit holds one (an even split of the bytes that count)."""
    kernels = [("k0", "VG_GEMM_A"), ("k1", "VG_GEMM_A"), ("k2", "VG_GEMM_B"), ("k3", "VG_GEMM_B")]
    source = "head\n" + "".join(_part(k, b, 5000) for k, b in kernels) + f"{PART}{ENTRIES}\nentries\n"
    units = split(source, 2)
    assert units is not None and len(units) == 2
    for block in ("VG_GEMM_A", "VG_GEMM_B"):
        assert sum(f"#ifndef {block}\n" in u for u in units) == 1, block
    together = [{k for k, _ in kernels if f"{HIDDEN}{k}{SIGNATURE} {{}}" in u} for u in units]
    assert sorted(map(sorted, together)) == [["k0", "k1"], ["k2", "k3"]]
    assert sum(u.count("entries") for u in units) == 1


def test_one_shared_block_is_not_compiled_twice_for_balance() -> None:
    """Two kernels around one large instance: one unit (both would compile the instance)."""
    source = "head\n" + _part("k0", "VG_GEMM_A", 9000) + _part("k1", "VG_GEMM_A", 9000) + f"{PART}{ENTRIES}\ne\n"
    units = split(source, 2)
    assert units is not None and len(units) == 1
    assert units[0].count(HIDDEN) == 2 + 2  # both definitions and their declarations for the entries


def test_unit_count_splits_smaller_sources_through_the_precompiled_prelude(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFUSE_CXX_UNITS", raising=False)
    monkeypatch.setattr(toolchain.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    assert toolchain.unit_count(150_000) == 1
    assert toolchain.unit_count(150_000, precompiled=True) == 2
    assert toolchain.unit_count(10_000, precompiled=True) == 1
