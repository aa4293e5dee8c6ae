"""The folded conv template (codegen/cpp/gemm/conv_wgrad.py: one GEMM over all images, for the
weight gradient's swapped conv) against torch.nn.functional.conv2d, and against eager's
convolution_backward weight gradient through the same swapped-conv form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import ConvSpec
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.conv_wgrad import render_conv2d_folded
from vfuse.schedule.conv_fold import folded_conv
from vfuse.schedule.microtile import VectorUnit

# Swapped convs of weight gradients: (images = C, channels = N, H, W, filters = Cout, kernel =
# Ho x Wo, stride = forward dilation, padding, dilation = forward stride).
SPECS = {
    "s1p1": ConvSpec("s1p1", 7, 2, 9, 9, 5, 9, 9, padding=(1, 1)),  # 3x3, pad 1, prime channels
    "s2p1": ConvSpec("s2p1", 3, 1, 8, 8, 11, 4, 4, padding=(1, 1), dilation=(2, 2)),  # stride 2 at 8x8, batch 1
    "s2p0": ConvSpec("s2p0", 13, 2, 10, 10, 3, 4, 4, dilation=(2, 2)),  # stride 2, pad 0: 3x3 plane
    "d2": ConvSpec("d2", 5, 3, 11, 11, 17, 7, 7, stride=(2, 2), padding=(2, 2)),  # forward dilation 2
    "wide": ConvSpec("wide", 37, 2, 12, 12, 40, 12, 12, padding=(1, 1)),  # columns > NC? several slivers
    # Row runs (stride 1, pad 0: conv_wgrad.row_runs): 32 images x 3 pixels = 96-float rows, every
    # sliver one whole run; 7 images at 5x3 pixels: runs cross rows and slivers end mid-run.
    "rows32": ConvSpec("rows32", 32, 3, 9, 9, 6, 4, 4, dilation=(2, 2)),
    "rows7": ConvSpec("rows7", 7, 2, 13, 9, 5, 5, 4, dilation=(2, 2)),
}


@pytest.fixture(scope="module")
def lib(build):
    epi = {"s1p1": E.bias_relu("c"), "wide": E.residual_add()}
    return build("\n".join(render_conv2d_folded(s, epi.get(n, E.none())) for n, s in SPECS.items()))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("nthreads", [1, 3])
def test_folded_conv_matches_torch(lib, call, name: str, nthreads: int) -> None:
    s = SPECS[name]
    torch.manual_seed(len(name))
    x, w = torch.randn(s.n, s.c_in, s.h, s.w), torch.randn(s.c_out, s.c_in, s.kh, s.kw)
    want = F.conv2d(x, w, None, s.stride, s.padding, s.dilation)
    assert folded_conv({"groups": 1}, x.shape, w.shape, want.shape), name
    out = torch.full_like(want, float("nan"))
    extras = []
    if name == "s1p1":
        extras = [torch.randn(s.c_out)]
        want = F.relu(want + extras[0].view(1, -1, 1, 1))
    elif name == "wide":
        extras = [torch.randn_like(want)]
        want = want + extras[0]
    call(lib, s.name, x, w, out, *extras, nthreads=nthreads)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_row_runs_copy_whole_slivers_without_a_call() -> None:
    """Stride 1 without padding: runs span an output row, and a sliver that is one run is a fixed
    NR-float copy; with padding (pixels may fall outside X) a run stays one pixel's images."""
    from vfuse.codegen.cpp.gemm.conv_wgrad import folded_blocking, row_runs

    src = render_conv2d_folded(SPECS["rows32"], E.none())
    nr = folded_blocking(SPECS["rows32"]).nr
    assert row_runs(SPECS["rows32"]) and f"if (nrun == 1 && nr == {nr})" in src
    assert f"for (int q = 0; q < {nr}; ++q) dst[q] = src[q];" in src
    assert not row_runs(SPECS["s1p1"]) and "nrun == 1" not in render_conv2d_folded(SPECS["s1p1"], E.none())


TIERS = [(VectorUnit(8, 16), "-march=x86-64-v3"), (VectorUnit(4, 16), "-march=x86-64")]


@pytest.mark.parametrize(("unit", "march"), TIERS, ids=["avx2", "generic"])
def test_folded_conv_other_tiers(build, call, unit: VectorUnit, march: str) -> None:
    s = ConvSpec(f"fold_tier{unit.lanes}", 5, 3, 10, 10, 7, 8, 8, padding=(1, 1), unit=unit)
    rows = ConvSpec(f"fold_rows{unit.lanes}", 16, 3, 9, 9, 7, 4, 4, dilation=(2, 2), unit=unit)  # row runs
    lib = build(render_conv2d_folded(s, E.none()) + render_conv2d_folded(rows, E.none()), (march,))
    for spec, pad in ((s, 1), (rows, 0)):
        x, w = torch.randn(spec.n, spec.c_in, spec.h, spec.w), torch.randn(spec.c_out, spec.c_in, spec.kh, spec.kw)
        want = F.conv2d(x, w, padding=pad, dilation=spec.dilation)
        out = torch.empty_like(want)
        call(lib, spec.name, x, w, out, nthreads=2)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_forward_convs_are_not_folded() -> None:
    """A forward conv (kernel smaller than its output plane), a grouped one, a big output plane: per image."""
    assert not folded_conv({"groups": 1}, (8, 32, 28, 28), (32, 32, 3, 3), (8, 32, 28, 28))
    assert not folded_conv({"groups": 2}, (4, 8, 9, 9), (6, 4, 9, 9), (4, 6, 3, 3))
    assert not folded_conv({"groups": 1}, (4, 8, 40, 40), (6, 8, 30, 30), (4, 6, 11, 11))
    with pytest.raises(ValueError, match="swapped operands of one group"):
        render_conv2d_folded(ConvSpec("g2", 2, 4, 9, 9, 4, 7, 7, groups=2), E.none(), swapped=True)


@pytest.mark.parametrize("nthreads", [1, 3])
def test_grouped_folded_conv_is_one_gemm_per_group(build, call, nthreads: int) -> None:
    """Groups (a grouped weight gradient over symbolic sizes takes the folded template): the driver's
    batch entries are the groups, each its weight rows, X's channels and C's rows; torch's values."""
    s = ConvSpec("g3", 5, 6, 9, 9, 9, 7, 7, padding=(1, 1), groups=3)
    torch.manual_seed(3)
    x, w = torch.randn(s.n, s.c_in, s.h, s.w), torch.randn(s.c_out, s.c_in // 3, s.kh, s.kw)
    want = F.conv2d(x, w, None, s.stride, s.padding, s.dilation, 3)
    out = torch.full_like(want, float("nan"))
    call(build(render_conv2d_folded(s, E.none())), s.name, x, w, out, nthreads=nthreads)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("name", ["s1p1", "s2p0", "wide", "rows32", "rows7"])
def test_folded_conv_reads_swapped_operands(build, call, name: str) -> None:
    """`swapped`: X and the weight given as the bytes of (IC, IMG, H, W) and (IC, OC, KH, KW) tensors
    (the weight gradient's x and grad_output read in place), same numbers."""
    s = SPECS[name]
    lib = build(render_conv2d_folded(s, E.none(), swapped=True))
    torch.manual_seed(7)
    x, w = torch.randn(s.n, s.c_in, s.h, s.w), torch.randn(s.c_out, s.c_in, s.kh, s.kw)
    want = F.conv2d(x, w, None, s.stride, s.padding, s.dilation)
    out = torch.full_like(want, float("nan"))
    call(lib, s.name, x.transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous(), out, nthreads=3)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
