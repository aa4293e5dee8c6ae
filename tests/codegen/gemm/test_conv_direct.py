"""The direct (padded-width, no im2col) conv path, strided ones over phase planes, against
torch.nn.functional.conv2d."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.codegen.cpp.gemm import Blocking, ConvSpec, Epilogue, render_conv2d
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.conv_direct import direct_fits, render_conv2d_direct


@dataclass(frozen=True)
class Case:
    spec: ConvSpec
    epi: Epilogue
    nthreads: int = 2


def _tile(mr: int, nr: int) -> Blocking:
    return Blocking(mr, nr, mr, 64, nr)  # only mr x nr matter to the direct path


def _spec(name: str, n: int, c: int, h: int, w: int, o: int, k: tuple[int, int], **kw: object) -> ConvSpec:
    # Compact columns are the schedule's choice (ConvSpec.compact); the cases named so take them.
    return ConvSpec(name, n, c, h, w, o, *k, compact="compact" in name, **kw)


# Every case takes the direct path (checked below). Names say what each one exercises.
CASES = {
    # conv_bn_relu's geometry, scaled down; batch 2 on 2 threads: whole images per thread.
    "pad1_bias_relu": Case(_spec("pad1_bias_relu", 2, 16, 13, 19, 16, (3, 3), padding=(1, 1)), E.bias_relu("c")),
    # Padding 0: garbage columns read across the row end; 5 output channels (< MR) pad the tile.
    "pad0_odd": Case(_spec("pad0_odd", 1, 3, 9, 11, 5, (3, 3)), E.bias("c"), nthreads=3),
    # Padding 2 on a 3x3: output wider than the input (the row gap exceeds the padding).
    "pad2_wide_out": Case(_spec("pad2_wide_out", 3, 4, 7, 17, 9, (3, 3), padding=(2, 2)), E.none()),
    # Asymmetric kernel and padding, width 33, residual read through `o` (garbage columns must
    # stay in bounds and valid ones must hit the right element).
    "asym_res": Case(_spec("asym_res", 2, 5, 10, 33, 12, (5, 3), padding=(2, 1)), E.residual_add()),
    "dilated": Case(_spec("dilated", 1, 6, 12, 14, 8, (3, 3), padding=(2, 2), dilation=(2, 2)), E.bias_silu("c")),
    "groups": Case(_spec("groups", 2, 8, 9, 10, 12, (3, 3), padding=(1, 1), groups=4), E.bias("c")),
    # A padded 1x1 (not the pointwise fast path): one tap.
    "one_by_one_pad": Case(_spec("one_by_one_pad", 1, 7, 5, 6, 10, (1, 1), padding=(1, 1)), E.bias_relu("c")),
    # Image smaller than one sliver: many output rows per NR columns.
    "tiny": Case(_spec("tiny", 3, 4, 3, 4, 6, (3, 3), padding=(1, 1)), E.bias("c"), nthreads=2),
    # Forced micro tiles, 1 thread, channel counts that are not multiples of MR.
    "tile14x32": Case(
        _spec("tile14x32", 1, 9, 8, 21, 30, (3, 3), padding=(1, 1), blocking=_tile(14, 32)), E.bias("c"), 1
    ),
    "tile6x64": Case(
        _spec("tile6x64", 2, 9, 6, 70, 13, (3, 3), padding=(1, 1), blocking=_tile(6, 64)), E.bias_relu("c"), 1
    ),
    # Strided convs over phase planes (conv_direct._Geom._phase_geometry): prime sizes, odd channels.
    "s2_pad1_prime": Case(_spec("s2_pad1_prime", 3, 5, 13, 11, 7, (3, 3), stride=(2, 2), padding=(1, 1)), E.bias("c")),
    "s2_pad0_res": Case(_spec("s2_pad0_res", 2, 3, 11, 13, 5, (3, 3), stride=(2, 2)), E.residual_add(), 3),
    # ResNet's downsample: a 1x1 stride 2 reads one phase plane only (a quarter of x).
    "s2_one_by_one": Case(_spec("s2_one_by_one", 2, 5, 7, 9, 3, (1, 1), stride=(2, 2)), E.bias_relu("c"), 1),
    "s3x2_asym": Case(_spec("s3x2_asym", 1, 4, 17, 10, 6, (5, 3), stride=(3, 2), padding=(2, 1)), E.residual_add(), 1),
    "s2_dilated": Case(
        _spec("s2_dilated", 2, 3, 12, 13, 9, (3, 3), stride=(2, 2), padding=(2, 2), dilation=(2, 2)), E.bias("c")
    ),
    "s2_groups": Case(
        _spec("s2_groups", 2, 6, 9, 10, 9, (3, 3), stride=(2, 2), padding=(1, 1), groups=3), E.bias_relu("c")
    ),
    # Stem-like: 7x7 stride 2 pad 3 on 1 channel.
    "s2_stem": Case(_spec("s2_stem", 1, 1, 19, 23, 8, (7, 7), stride=(2, 2), padding=(3, 3)), E.bias("c"), 1),
}


def _extras(epi: Epilogue, c_out: int, out_shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.randn(out_shape) if a.name == "residual" else torch.randn(c_out) for a in epi.args]


def _reference(case: Case, x: torch.Tensor, w: torch.Tensor, extras: list[torch.Tensor]) -> torch.Tensor:
    s = case.spec
    y = F.conv2d(x, w, None, s.stride, s.padding, s.dilation, s.groups)
    name = case.epi.name
    if name == "residual":
        return y + extras[0]
    if name.startswith("bias"):
        y = y + extras[0].view(1, -1, 1, 1)
    return {"bias_relu": F.relu, "bias_silu": F.silu}.get(name, lambda v: v)(y)


@pytest.fixture(scope="module")
def lib(build):
    return build("\n".join(render_conv2d(c.spec, c.epi) for c in CASES.values()))


def test_cases_take_the_direct_path() -> None:
    for case in CASES.values():
        assert "(direct, padded width" in render_conv2d(case.spec, case.epi), case.spec.name


def test_strided_direct_path_reads_phase_planes() -> None:
    """Strided convs take the direct path over phase planes: no im2col packer and no copy call; a 3x3
    stride 2 stores all four phases, a 1x1 stride 2 one; the stride-1 pointwise 1x1 keeps the packed
    GEMM (its B is X itself, no gather to save)."""
    s2 = ConvSpec("s2", 1, 4, 9, 9, 8, 3, 3, stride=(2, 2), padding=(1, 1))
    assert direct_fits(s2, 8, 48)
    for spec, phases in ((s2, 4), (ConvSpec("d1", 2, 4, 10, 10, 8, 1, 1, stride=(2, 2)), 1)):
        src = render_conv2d(spec, E.none())
        assert f"{phases} phase planes" in src, spec.name
        kernel = src[src.index("// vfuse conv2d (direct") :]
        # No B packer: the only copy call is the output runs' (portable tier only, AVX tiers store them).
        assert "_im2col(" not in kernel and "_phases(" not in kernel and "memmove" not in kernel
        assert kernel.count("std::memcpy(") == 1
    src = render_conv2d_direct(s2, E.none(), 8, 48)
    assert "(direct, padded width 6, 4 phase planes)" in src
    assert "(direct" not in render_conv2d(ConvSpec("pw", 1, 4, 9, 9, 8, 1, 1), E.none())


@pytest.mark.parametrize("name", list(CASES))
def test_direct_conv_matches_torch(lib, call, name: str) -> None:
    case = CASES[name]
    s = case.spec
    torch.manual_seed(len(name))
    x = torch.randn(s.n, s.c_in, s.h, s.w)
    w = torch.randn(s.c_out, s.c_in // s.groups, s.kh, s.kw) / (s.c_in // s.groups * s.kh * s.kw) ** 0.5
    out = torch.full((s.n, s.c_out, *s.out_hw), float("nan"))
    extras = _extras(case.epi, s.c_out, tuple(out.shape))
    call(lib, s.name, x, w, out, *extras, nthreads=case.nthreads)
    torch.testing.assert_close(out, _reference(case, x, w, extras), rtol=1e-4, atol=1e-4)
    # A second call reuses the scratch buffers: same answer.
    again = torch.full_like(out, float("nan"))
    call(lib, s.name, x, w, again, *extras, nthreads=case.nthreads)
    torch.testing.assert_close(again, out, rtol=0, atol=0)


def _avx2(mr: int, nr: int) -> Blocking:
    return Blocking(mr, nr, mr, 64, nr, 8)


# AVX2's tiles (8-lane vectors) compiled for x86-64-v3: the 8-lane copy into Y, and channel
# counts that leave a tail block of OCg % mr rows (its own micro-kernel) or none.
AVX2_CASES = {
    "avx2_4x24_tail": Case(
        _spec("avx2_4x24_tail", 2, 5, 9, 30, 11, (3, 3), padding=(1, 1), blocking=Blocking(4, 24, 4, 64, 24, 8)),
        E.bias_relu("c"),
    ),
    "avx2_6x16_tail": Case(
        _spec("avx2_6x16_tail", 1, 7, 6, 13, 16, (3, 3), padding=(1, 1), blocking=Blocking(6, 16, 6, 64, 16, 8)),
        E.residual_add(),
        1,
    ),
    "avx2_4x24_exact": Case(
        _spec("avx2_4x24_exact", 3, 3, 5, 23, 8, (3, 3), blocking=Blocking(4, 24, 4, 64, 24, 8)), E.bias("c")
    ),
    # Compact columns (OW % 8 == 0: each vector one row's outputs, no garbage columns): a 16x16 plane
    # with a residual read at every output; a 9x8 plane whose last sliver is partial (a clamped
    # vector) on 3 threads (all images padded first); padding 0 (OW 16 of W 18); dilation.
    "avx2_compact_16": Case(
        _spec("avx2_compact_16", 2, 5, 16, 16, 13, (3, 3), padding=(1, 1), blocking=Blocking(6, 16, 6, 64, 16, 8)),
        E.residual_add(),
    ),
    "avx2_compact_8x8": Case(
        _spec("avx2_compact_8x8", 1, 7, 9, 8, 11, (3, 3), padding=(1, 1), blocking=_avx2(6, 16)), E.bias_relu("c"), 3
    ),
    "avx2_compact_pad0": Case(
        _spec("avx2_compact_pad0", 3, 4, 10, 18, 9, (3, 3), blocking=Blocking(6, 16, 6, 64, 16, 8)), E.bias("c"), 1
    ),
    "avx2_compact_dilated": Case(
        _spec("avx2_compact_dilated", 2, 3, 9, 16, 7, (3, 3), padding=(2, 2), dilation=(2, 2), blocking=_avx2(4, 24)),
        E.residual_add(),
    ),
    # Compact columns saving under 2 % (OW 40 of Wp 41): 1 channel in, 5 out, batch 1, 7 rows; slivers span
    # rows and the last one is partial.
    "avx2_compact_thin": Case(
        _spec("avx2_compact_thin", 1, 1, 7, 40, 5, (3, 3), padding=(1, 1), blocking=_avx2(4, 24)), E.bias_relu("c"), 1
    ),
    # Padded width, output runs of every kind into Y (no masked stores: whole vectors ending at the run's
    # end, overlapping 4-wide pairs, single floats): Wp 25 for OW 23 at NR 24 starts a sliver at each
    # column in turn (runs of 1, 2, 3 ... 23 floats); Wp 27 at NR 16 (runs of 1, 3, 4, 5, 6, 16 ...).
    "avx2_runs_pad0": Case(_spec("avx2_runs_pad0", 1, 1, 30, 25, 5, (3, 3), blocking=_avx2(4, 24)), E.bias("c"), 1),
    "avx2_runs_pad1": Case(
        _spec("avx2_runs_pad1", 2, 3, 13, 26, 7, (3, 3), padding=(1, 1), blocking=_avx2(6, 16)), E.residual_add(), 2
    ),
    # Strided (phase planes): a tail block; compact columns over a 17-wide phase (OW 16 of W 32).
    "avx2_s2_4x24_tail": Case(
        _spec("avx2_s2_4x24_tail", 2, 5, 19, 29, 11, (3, 3), stride=(2, 2), padding=(1, 1), blocking=_avx2(4, 24)),
        E.bias_relu("c"),
    ),
    "avx2_s2_compact": Case(
        _spec("avx2_s2_compact", 2, 3, 15, 32, 7, (3, 3), stride=(2, 2), padding=(1, 1), blocking=_avx2(6, 16)),
        E.residual_add(),
        1,
    ),
    "avx2_s2_1x1": Case(_spec("avx2_s2_1x1", 3, 7, 13, 14, 13, (1, 1), stride=(2, 2), blocking=_avx2(6, 16)), E.none()),
}


@pytest.mark.parametrize("name", list(AVX2_CASES))
def test_direct_conv_avx2_tiles(build, call, name: str) -> None:
    from vfuse.targets.cpu import machine_flags

    if not {"avx2", "fma"} <= set(machine_flags()):
        pytest.skip("needs an AVX2 CPU")
    case = AVX2_CASES[name]
    s = case.spec
    src = render_conv2d(s, case.epi)
    assert "(direct, padded width" in src and ("_ukrt<" in src) == (s.c_out % s.tiles().mr != 0)
    # Compact columns load through a pointer per vector; the copy into Y has no masked store.
    assert ("x0 = x + vo[0];" in src) == ("compact" in name) and "_mm256_maskstore_ps" not in src
    assert f"{s.name}_epi_y(t, Y," in src  # a sliver of one whole run: its epilogue writes Y
    lib = build(src, ("-march=x86-64-v3",))
    torch.manual_seed(len(name))
    x = torch.randn(s.n, s.c_in, s.h, s.w)
    w = torch.randn(s.c_out, s.c_in, s.kh, s.kw) / (s.c_in * s.kh * s.kw) ** 0.5
    out = torch.full((s.n, s.c_out, *s.out_hw), float("nan"))
    extras = _extras(case.epi, s.c_out, tuple(out.shape))
    call(lib, s.name, x, w, out, *extras, nthreads=case.nthreads)
    torch.testing.assert_close(out, _reference(case, x, w, extras), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("hw", "lanes", "compact"), [(16, 8, True), (8, 8, True), (56, 8, True), (12, 8, False), (16, 16, False)]
)
def test_schedule_chooses_compact_columns(hw: int, lanes: int, compact: bool) -> None:
    """The schedule decides compact columns (kernel attrs), the renderer reads them: at 8 lanes where a
    row is whole vectors and the padded width computes more slivers (16x16: 272 columns for 256; 56x56:
    3192 for 3136); not where a row is no whole vectors (12 at 8 lanes) nor at 16 lanes."""
    from vfuse.schedule.conv_columns import compact_columns

    attrs = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
    x, w, out = (2, 16, hw, hw), (16, 16, 3, 3), (2, 16, hw, hw)
    assert compact_columns(attrs, x, w, out, lanes, 16) is compact


def test_compact_columns_chosen_end_to_end_at_avx2() -> None:
    """A 16x16 3x3 conv compiled for AVX2: the schedule marks compact columns and the result matches."""
    from vfuse.schedule.kernel import ContractionKernel
    from vfuse.targets.cpu import machine_flags

    if not {"avx2", "fma"} <= set(machine_flags()):
        pytest.skip("needs an AVX2 CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, 1, 1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 16, 16, 16)
    with torch.no_grad():
        g = vfuse.compile(model, (x,), freeze=True, isa="avx2", strict=True)
        torch.testing.assert_close(g(x), model(x), rtol=1e-4, atol=1e-5)
    kernels = [k for s in g.compiled.executor.program.steps for k in getattr(s, "kernels", ())]
    convs = [k for k in kernels if isinstance(k, ContractionKernel)]
    assert [bool(k.attrs.get("compact")) for k in convs] == [True]


# Strided geometries at x86-64-v3, where g++ 12 -O3 miscompiled vectorized phase copies of short rows
# (conv_direct._phase_pad): row / column strides 1-3, paddings 0-2, prime and tiny widths.
SWEEP = [
    ((1, 2), (2, 0), (5, 3), (12, 17)),
    ((1, 2), (2, 0), (1, 3), (12, 7)),
    ((2, 1), (1, 2), (3, 3), (11, 5)),
    ((2, 2), (1, 1), (3, 3), (7, 7)),
    ((2, 2), (0, 0), (1, 1), (13, 11)),
    ((3, 2), (2, 1), (3, 5), (10, 19)),
    ((2, 3), (0, 2), (2, 4), (9, 23)),
    ((2, 2), (3, 3), (7, 7), (29, 31)),
]


def test_strided_direct_sweep_avx2(build, call) -> None:
    from vfuse.targets.cpu import machine_flags

    if not {"avx2", "fma"} <= set(machine_flags()):
        pytest.skip("needs an AVX2 CPU")
    specs = [
        ConvSpec(f"sweep{i}", 2, 3, *hw, 5, *k, stride=st, padding=pad, blocking=_avx2(6, 16))
        for i, (st, pad, k, hw) in enumerate(SWEEP)
    ]
    lib = build("\n".join(render_conv2d(s, E.none()) for s in specs), ("-march=x86-64-v3",))
    for s in specs:
        torch.manual_seed(1)
        x, w = torch.randn(s.n, s.c_in, s.h, s.w), torch.randn(s.c_out, s.c_in, s.kh, s.kw)
        out = torch.full((s.n, s.c_out, *s.out_hw), float("nan"))
        call(lib, s.name, x, w, out, nthreads=1)
        torch.testing.assert_close(out, F.conv2d(x, w, None, s.stride, s.padding), rtol=1e-4, atol=1e-4)


@pytest.mark.aarch64
@pytest.mark.parametrize(("w", "compact"), [(16, True), (13, False)])
def test_direct_conv_on_arm64(tmp_path, w: int, compact: bool) -> None:
    """The direct conv at NEON (4 lanes) cross-compiled for ARM64 and run under qemu: compact columns
    (OW 16: 112 columns for 119 padded, loads through a pointer per vector) and the padded width (W 13),
    3 -> 5 channels, batch 1."""
    from tests.aarch64.cross import missing_tools, run_arm64

    from vfuse.compiler import optimize, plan, render, schedule
    from vfuse.context import Context, Options
    from vfuse.entry.aot import export
    from vfuse.frontend.lower import lower
    from vfuse.targets import get_target
    from vfuse.targets.cpu import at_tier
    from vfuse.targets.isa import ARM, CpuIsa, Isa

    if missing_tools() is not None:
        pytest.skip(str(missing_tools()))
    torch.manual_seed(w)
    inputs = (torch.randn(1, 3, 7, w), torch.randn(5, 3, 3, 3), torch.randn(5))

    def fn(x: torch.Tensor, wt: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.relu(F.conv2d(x, wt, b, padding=1))

    ctx = Context(Options(backend="cpp"))
    graph = optimize(lower(export(fn, inputs).graph_module, ctx), ctx)
    neon = at_tier(get_target("cpu"), CpuIsa(Isa.NEON, frozenset(), ARM))
    program = schedule(plan(graph, ctx, neon), neon, ctx)
    source = render(program, ctx)
    assert "(direct, padded width" in source and ("x0 = x + vo[0];" in source) == compact
    got = run_arm64(program, graph, source, inputs, [], tmp_path)
    torch.testing.assert_close(got[graph.outputs[0]], fn(*inputs), rtol=1e-4, atol=1e-4)
