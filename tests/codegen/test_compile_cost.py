"""What a cold compile costs in g++: kernels that repeat (a model's layers) compile one body
(codegen/cpp/shared.py), with the same results; the units of a split compile at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, scalar, target

from vfuse.codegen.cpp import render, toolchain
from vfuse.codegen.cpp.function import SIGNATURE
from vfuse.codegen.cpp.shared import PREFIX, share_bodies
from vfuse.codegen.cpp.units import split
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.report.source import kernel_source
from vfuse.schedule import build


def _normalize(b: GraphBuilder, x: str, w: str) -> str:
    """(x - mean(x)) * w over the last dim: one row kernel."""
    mean = b.add(Op.DIV, [b.add(Op.SUM, [x], axes=(1,), keepdim=True), scalar(b, 37.0)])
    return b.add(Op.MUL, [b.add(Op.SUB, [x, mean]), w])


def _layers() -> Graph:
    """Two 'layers' alike but for their buffers (a row kernel each, then a GEMM between them),
    at odd sizes, and one different row kernel."""
    b = GraphBuilder()
    x, w0, w1, m = inputs(b, ((13, 37), DType.F32), ((37,), DType.F32), ((37,), DType.F32), ((37, 37), DType.F32))
    h = _normalize(b, x, w0)
    h = _normalize(b, b.add(Op.MATMUL, [h, m]), w1)
    other = b.add(Op.SUM, [b.add(Op.EXP, [x])], axes=(1,), keepdim=True)
    return b.build([h, other])


def _eager(x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, m: torch.Tensor) -> list[torch.Tensor]:
    h = (x - x.sum(1, keepdim=True) / 37) * w0
    h = h @ m
    return [(h - h.sum(1, keepdim=True) / 37) * w1, x.exp().sum(1, keepdim=True)]


def test_repeated_kernels_compile_one_body() -> None:
    source = render(build(plan_fusion(_layers(), target()), target()))
    bodies = [line for line in source.splitlines() if line.startswith(f"static void {PREFIX}")]
    assert len(bodies) == 2, bodies  # the body, guarded in each of its two kernels' parts
    name = bodies[0].split()[2].split("(")[0]
    assert source.count(f"  {name}(bufs, arena, seeds, nt, ") == 2
    for k in ("k0", "k2"):  # the report shows each kernel with the body it calls
        assert f"static void {name}(" in kernel_source(source, k, ("k0", "k1_c", "k2", "k3"))
    units = split(source, 2)
    assert units is not None
    for unit in units:  # a unit that calls it defines it, once
        calls = unit.count(f"  {name}(bufs, arena, seeds, nt, ")
        assert (f"static void {name}(" in unit) == (calls > 0)


def test_shared_bodies_match_eager(tmp_path: Path) -> None:
    xs = [torch.randn(13, 37), torch.randn(37), torch.randn(37), torch.randn(37, 37)]
    got = executor(_layers(), cache_dir=tmp_path)(list(xs))
    for g, want in zip(got, _eager(*xs), strict=True):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
    assert any(PREFIX in p.read_text() for p in tmp_path.glob("vf_*.cpp") if not p.name.startswith("vf_pch"))


def _kernel(name: str, pointers: list[str], body: list[str], before: tuple[str, ...] = ("// doc",)) -> str:
    return "\n".join([*before, f"static void {name}{SIGNATURE} {{", *(f"  {p}" for p in pointers), *body, "}"])


_X = "const float* __restrict p_x{} = (const float*)bufs[{}];"
_Y = "float* __restrict p_y{} = (float*)(arena + {});"


def _pair(body: str, other: str | None = None) -> list[tuple[str, str]]:
    return [
        ("k0", _kernel("k0", [_X.format(0, 0), _Y.format(0, 64)], [body.format(y="p_y0", x="p_x0")])),
        ("k1", _kernel("k1", [_X.format(1, 1), _Y.format(1, 128)], [(other or body).format(y="p_y1", x="p_x1")])),
    ]


def test_bodies_alike_but_for_their_pointers_are_shared() -> None:
    kernels = _pair("  for (int64_t i = 0; i < 8; ++i) {y}[i] = {x}[i] * 2.0f;")
    out = share_bodies(kernels)
    assert all(PREFIX in text for text in out)
    assert "(float*)(arena + 64), (const float*)bufs[0]);" in out[0]  # in the order the body names them
    assert "(float*)(arena + 128), (const float*)bufs[1]);" in out[1]
    assert "vf_q0[i] = vf_q1[i] * 2.0f;" in out[0] and out[0].split("#endif")[0] == out[1].split("#endif")[0]


@pytest.mark.parametrize(
    ("body", "other"),
    [
        ("  {y}[0] = {x}[0] * 2.0f;", "  {y}[0] = {x}[0] * 3.0f;"),  # a constant differs
        ('  vf_fail("{y}"); {y}[0] = {x}[0];', None),  # a pointer's name in a string: not renamed
        ("#define TWO 2\n  {y}[0] = {x}[0] * TWO;", None),  # a macro: means what precedes it says
        ("#if VF_D == 64\n  {y}[0] = {x}[0];\n#endif", None),  # a test of vfuse's own macro
    ],
)
def test_bodies_that_are_not_the_same_stay_as_they_are(body: str, other: str | None) -> None:
    kernels = _pair(body, other)
    assert share_bodies(kernels) == [text for _, text in kernels]


def test_kernels_with_other_attributes_or_pointer_types_are_not_shared() -> None:
    body = ["  {y}[0] = {x}[0];".format(y="p_y0", x="p_x0")]
    plain = _kernel("k0", [_X.format(0, 0), _Y.format(0, 64)], body)
    tuned = _kernel(
        "k1", [_X.format(0, 0), _Y.format(0, 64)], body, ("// doc", '__attribute__((optimize("no-tree-pre")))')
    )
    wide = _kernel("k2", [_X.format(0, 0), "double* __restrict p_y0 = (double*)(arena + 64);"], body)
    kernels = [("k0", plain), ("k1", tuned), ("k2", wide)]
    assert share_bodies(kernels) == [plain, tuned, wide]


def test_isa_tests_in_a_body_do_not_stop_sharing() -> None:
    kernels = _pair("#if defined(__AVX__) && !defined(__AVX512F__)\n  {y}[0] = {x}[0];\n#else\n  {y}[0] = 0;\n#endif")
    assert all(PREFIX in text for text in share_bodies(kernels))


def test_units_compile_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unit's compiler runs before the first is waited for (two cores: two at a time)."""
    events: list[str] = []
    real = subprocess.Popen

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, cmd: list[str], *a: object, **k: object) -> None:
            if "-c" in cmd:  # a unit's compile, not the link or a version query
                events.append("start")
            super().__init__(cmd, *a, **k)

        def communicate(self, *a: object, **k: object) -> tuple[bytes, bytes]:
            if "-c" in self.args:
                events.append("wait")
            return super().communicate(*a, **k)

    monkeypatch.setattr(toolchain.subprocess, "Popen", Recorded)
    monkeypatch.setenv("VFUSE_CXX_UNITS", "2")
    xs = [torch.randn(13, 37), torch.randn(37), torch.randn(37), torch.randn(37, 37)]
    got = executor(_layers(), cache_dir=tmp_path)(list(xs))
    torch.testing.assert_close(got[0], _eager(*xs)[0], rtol=1e-5, atol=1e-5)
    assert events == ["start", "start", "wait", "wait"], events
