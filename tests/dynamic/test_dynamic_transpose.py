"""Tiled transposes over symbolic sizes (schedule/transpose.py `stream_tiles`): a kernel whose
loads and stores may move STREAM_MIN_LLCS or not, and whose output rows may start on a cache
line or not (a row of b floats: b % 16), streams its tile rows per call (one flag from the call's
sizes: into the L1 row buffer copied out with `vf_stream`, or straight into the output), not at
the first call's size; fixed sizes decide once. A 16 KiB LLC puts the byte limit at 32 KiB."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.codegen.vectorization import simd_loops_vectorized
from tests.dynamic.gates import holds, sizes_of

import vfuse
import vfuse.compiler as compiler
from vfuse.codegen.cpp.streaming import STREAM_FLAG
from vfuse.schedule.kernel import Kernel, Program, Walk
from vfuse.targets import get_target


@pytest.fixture
def built(rendered: list[tuple[Program, str]], monkeypatch: pytest.MonkeyPatch) -> list[tuple[Program, str]]:
    target = dataclasses.replace(get_target("cpu"), l1_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=16 << 10)
    monkeypatch.setattr(compiler, "target_of", lambda ctx: target)
    return rendered


def _f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.t() + y * 2


def _check(c: object, shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    with torch.no_grad():
        for i, (a, b) in enumerate(shapes):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(b, a, generator=g), torch.randn(a, b, generator=g)
            torch.testing.assert_close(c(x, y), _f(x, y))  # type: ignore[operator]
    return shapes


# (a, b): the output is a x b. 96 x 128 moves 147 KiB and its rows start on lines; 40 x 50
# moves 23 KiB, 20 x 112 26 KiB; 200 x 130 is large, but its rows start mid-line (130 floats).
SHAPES = [(40, 50), (200, 130), (300, 160), (20, 112), (96, 128), (2, 3)]


@pytest.mark.parametrize("first", [(96, 128), (70, 100)])
def test_transposed_tiles_stream_per_call(built: list, first: tuple[int, int], tmp_path: Path) -> None:
    c = torch.compile(_f, backend=vfuse.backend(strict=True), dynamic=True)
    shapes = _check(c, [first, *SHAPES])
    ((program, source),) = built  # one build serves every size
    (k,) = [k for k in program.kernels if isinstance(k, Kernel) and k.walk is Walk.TILED_TRANSPOSE]
    gate = k.stream_gate
    assert gate is not None and gate.limit == 32 << 10 and gate.aligned
    on = [holds(gate, sizes_of(program, (b, a), (a, b))) for a, b in shapes]
    assert on[1:] == [False, False, True, False, True, False]  # both sides, by bytes and by alignment
    # (render.py may also render a copy at the hint's row length: its flag from constants.)
    assert f"const bool {STREAM_FLAG} =" in source and f"if ({STREAM_FLAG}) {{" in source
    # The one row loop both choices share (into the row buffer or the output) still vectorizes.
    simd, vectorized = simd_loops_vectorized(source, tmp_path)
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"


@pytest.mark.parametrize(("shape", "streamed"), [((96, 128), True), ((200, 130), False)])
def test_fixed_sizes_decide_once_without_a_flag(built: list, shape: tuple[int, int], streamed: bool) -> None:
    c = torch.compile(_f, backend=vfuse.backend(strict=True), dynamic=False)
    _check(c, [shape])
    ((program, source),) = built
    (k,) = [k for k in program.kernels if isinstance(k, Kernel)]
    assert k.walk is Walk.TILED_TRANSPOSE and k.stream_gate is None and k.stream is streamed
    assert STREAM_FLAG not in source and ("vf_stream(&" in source) == streamed
