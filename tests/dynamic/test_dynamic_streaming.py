"""Streamed stores over symbolic sizes (schedule/nest.py `StreamGate`): where the sizes' range holds
calls on both sides of the streaming limit, the kernel decides per call (one flag computed from
the call's sizes, `codegen/cpp/streaming.py`), not at the first call's size; fixed sizes keep
their fixed choice and no flag. A target with a 16 KiB LLC (and Zen 3's 512 KiB L2, where row
walks with prefetched rows stream: `strategy.stream_prefetched_rows`) puts the limit at 32 KiB,
so small tensors land on both sides of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.codegen.vectorization import simd_loops_vectorized
from torch.export import Dim

import vfuse
import vfuse.compiler as compiler
from vfuse.codegen.cpp.streaming import STREAM_FLAG
from vfuse.schedule.kernel import Kernel, Program
from vfuse.targets import get_target

LLC = 16 << 10  # streamed from 2 LLCs: 32 KiB moved


@pytest.fixture
def built(rendered: list[tuple[Program, str]], monkeypatch: pytest.MonkeyPatch) -> list[tuple[Program, str]]:
    """Compiles for the small-LLC target; lists each rendered (Program, C++ source)."""
    small = dataclasses.replace(get_target("cpu"), l2_bytes=512 << 10, l3_bytes=LLC)
    monkeypatch.setattr(compiler, "target_of", lambda ctx: small)
    return rendered


def _gated(program: Program) -> Kernel:
    (k,) = [k for k in program.kernels if isinstance(k, Kernel) and k.stream_gate is not None]
    return k


def _moved(k: Kernel, sizes: dict[str, int]) -> int:
    """The gate's bytes at the call's symbol values (by name)."""
    env = k.stream_gate.moved.env
    return env.evaluator(k.stream_gate.moved.expr)(*(sizes[s.name] for s in env.symbols))


def _check(fn: Callable[[torch.Tensor], torch.Tensor], c: Callable, shapes: list[tuple[int, int]]) -> None:
    with torch.no_grad():
        for i, shape in enumerate(shapes):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(i)) * 3
            x[0, :2] = torch.tensor([-80.0, 70.0])
            torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-6)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


@pytest.mark.parametrize("first", [(5, 600), (11, 1031)])
def test_softmax_streams_per_call_on_both_sides(built: list, first: tuple[int, int]) -> None:
    # softmax reads and writes 8 bytes per element: (5, 600) moves 24000 bytes, under the limit
    # (the issue: a first call under it left every later call unstreamed), (11, 1031) 90728 over it.
    shapes = [first, (3, 600), (9, 700), (2, 1031), (7, 1031), (37, 61), (64, 513)]
    c = torch.compile(_softmax, backend=vfuse.backend(), dynamic=True)
    _check(_softmax, c, shapes)
    ((program, source),) = built  # one build serves every size
    k = _gated(program)
    assert k.stream_gate.limit == 2 * LLC
    # The sizes land on both sides of the limit: both paths of the flag ran.
    (rows, cols) = sorted(s.name for s in k.stream_gate.moved.env.symbols)
    moved = [_moved(k, {rows: r, cols: d}) for r, d in shapes]
    assert min(moved) < 2 * LLC <= max(moved)
    copied = k.at_hint is not None and k.at_hint.kernel.stream_gate is not None  # its copy at the hint (rowhint.py)
    assert source.count(f"const bool {STREAM_FLAG} =") == 1 + copied and f"if ({STREAM_FLAG})" in source


def test_layer_norm_rows_of_a_fixed_width_stream_per_call(built: list, tmp_path: Path) -> None:
    # Dynamo keeps the width (the weight's) fixed: the rows alone are symbolic.
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(1000)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    c = torch.compile(ln, backend=vfuse.backend(), dynamic=True)
    shapes = [(3, 1000), (2, 1000), (4, 1000), (5, 1000), (31, 1000), (130, 1000)]
    _check(ln, c, shapes)
    ((program, source),) = built
    k = _gated(program)
    (rows,) = [s.name for s in k.stream_gate.moved.env.symbols]
    moved = [_moved(k, {rows: r}) for r, _ in shapes]
    assert min(moved) < 2 * LLC <= max(moved)
    assert f"if ({STREAM_FLAG})" in source
    # The one loop both choices share (into the chunk buffer or the output) still vectorizes.
    simd, vectorized = simd_loops_vectorized(source, tmp_path)
    assert simd and simd == vectorized, f"pragmas at lines {sorted(simd - vectorized)} not vectorized"


@pytest.mark.parametrize(("shape", "streamed"), [((3, 600), False), ((9, 700), True)])
def test_fixed_sizes_decide_once_without_a_flag(built: list, shape: tuple[int, int], streamed: bool) -> None:
    c = torch.compile(_softmax, backend=vfuse.backend(), dynamic=False)
    _check(_softmax, c, [shape])
    ((program, source),) = built
    kernels = [k for k in program.kernels if isinstance(k, Kernel)]
    assert all(k.stream_gate is None for k in kernels) and [k.stream for k in kernels] == [streamed]
    assert STREAM_FLAG not in source and ("vf_stream(&" in source) == streamed


def test_report_names_per_call_streaming_and_choices_that_flip(built: list) -> None:
    from vfuse.report.text import render_text

    rows, cols = Dim("rows", min=2, max=1 << 20), Dim("cols", min=2, max=1 << 16)
    report = vfuse.explain(_softmax, torch.randn(5, 600), dynamic_shapes={"x": {0: rows, 1: cols}})
    r, c = (s.split(" = ")[0] for s in report.symbols)  # the symbols' names (rows first)
    # Streamed where the stores alone move 2 LLCs, or with the loads where the rows are prefetched
    # (strategy.stream_prefetched_rows), which a symbolic width also decides per call.
    per_call = f"stores: chosen per call, streamed where 4*{r}*{c} >= {2 * LLC} bytes or (8*{r}*{c} >= {2 * LLC} and ("
    assert any(per_call in f for f in report.flips), report.flips
    assert any("prefetch: chosen per call, Min(8, " in f for f in report.flips), report.flips
    # 5 x 600 elements would run on one thread (under strategy.PARALLEL_MIN, 32768), 55 rows of 600 on
    # several: each call tests its own sizes, so the choice is per call and flips at no hint.
    assert f"k0 (row) threads: chosen per call, several where {r}*{c} >= 32768 loop points" in report.flips
    assert not [f for f in report.flips if "threads: one at" in f], report.flips
    assert "chosen per call" in render_text(report)
