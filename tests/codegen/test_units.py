"""A program's C++ split into units compiled in parallel (codegen/cpp/units.py): the same
results as one unit, every kernel defined once, and a failed split falls back to one unit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, target

from vfuse.codegen.cpp import render, toolchain
from vfuse.codegen.cpp.units import ENTRIES, HIDDEN, PART, split
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
