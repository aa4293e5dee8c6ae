"""Generated conv2d + epilogue kernels (direct and implicit-GEMM paths) against torch.nn.functional.conv2d."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.gemm import Blocking, ConvSpec, Epilogue, render_conv2d
from vfuse.codegen.cpp.gemm import epilogues as E
from vfuse.codegen.cpp.gemm.conv import render_conv2d_gemm
from vfuse.schedule.microtile import VectorUnit


@dataclass(frozen=True)
class Case:
    spec: ConvSpec
    epi: Epilogue
    extras: tuple[str, ...]  # "bias" / "scale" / "shift" (per output channel), "res" (like the output)
    act: str = "none"  # applied after the affine part in the reference
    nthreads: int = 2


CASES = {
    "bn_relu_3x3": Case(
        ConvSpec("bn_relu_3x3", 2, 5, 11, 11, 7, 3, 3, padding=(1, 1)), E.scale_shift_relu(), ("scale", "shift"), "relu"
    ),
    "stride2_silu": Case(
        ConvSpec("stride2_silu", 1, 4, 13, 9, 10, 3, 3, stride=(2, 2), padding=(1, 1)),
        E.bias_silu("c"),
        ("bias",),
        "silu",
        nthreads=3,
    ),
    "dilated_res": Case(
        ConvSpec("dilated_res", 2, 3, 10, 12, 6, 3, 3, padding=(2, 2), dilation=(2, 2)), E.residual_add(), ("res",)
    ),
    "groups2": Case(ConvSpec("groups2", 2, 6, 8, 8, 4, 3, 3, padding=(1, 1), groups=2), E.bias("c"), ("bias",)),
    "depthwise": Case(
        ConvSpec("depthwise", 1, 8, 9, 7, 8, 3, 3, padding=(1, 1), groups=8),
        E.scale_shift_silu(),
        ("scale", "shift"),
        "silu",
    ),
    "pointwise_1x1": Case(ConvSpec("pointwise_1x1", 2, 16, 7, 7, 24, 1, 1), E.bias_relu("c"), ("bias",), "relu"),
    "stride2_1x1": Case(ConvSpec("stride2_1x1", 1, 8, 9, 9, 12, 1, 1, stride=(2, 2)), E.none(), ()),
    "asym_5x3": Case(ConvSpec("asym_5x3", 1, 3, 12, 17, 5, 5, 3, stride=(1, 2), padding=(2, 0)), E.none(), ()),
    # Wide output rows and many channels: several slivers per output row and MC > MR.
    "wide": Case(
        ConvSpec("wide", 1, 16, 6, 70, 40, 3, 3, padding=(1, 1)),
        E.scale_shift_relu(),
        ("scale", "shift"),
        "relu",
        nthreads=1,
    ),
}


def _extras(case: Case, out_shape: torch.Size) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    made = {k: (torch.randn(out_shape) if k == "res" else torch.randn(case.spec.c_out)) for k in case.extras}
    return list(made.values()), made


def _reference(case: Case, x: torch.Tensor, w: torch.Tensor, made: dict[str, torch.Tensor]) -> torch.Tensor:
    s = case.spec
    y = F.conv2d(x, w, None, s.stride, s.padding, s.dilation, s.groups)
    per_channel = {k: v.view(1, -1, 1, 1) for k, v in made.items() if k != "res"}
    if "scale" in per_channel:
        y = y * per_channel["scale"] + per_channel["shift"]
    if "bias" in per_channel:
        y = y + per_channel["bias"]
    if "res" in made:
        y = y + made["res"]
    return {"none": y, "relu": F.relu(y), "silu": F.silu(y)}[case.act]


# Stride-1 cases take the direct path in render_conv2d; these keep the implicit-GEMM path (and
# its stride-1 im2col table) tested too, under a "_gemm" suffix.
GEMM_PATH = ("bn_relu_3x3", "dilated_res", "groups2", "wide")


@pytest.fixture(scope="module")
def lib(build):
    direct = [render_conv2d(c.spec, c.epi) for c in CASES.values()]
    gemm = [render_conv2d_gemm(replace(CASES[n].spec, name=f"{n}_gemm"), CASES[n].epi) for n in GEMM_PATH]
    return build("\n".join(direct + gemm))


@pytest.mark.parametrize("name", list(CASES) + [f"{n}_gemm" for n in GEMM_PATH])
def test_conv_matches_torch(lib, call, name: str) -> None:
    case = CASES[name.removesuffix("_gemm")]
    s = replace(case.spec, name=name)
    torch.manual_seed(len(name))
    x = torch.randn(s.n, s.c_in, s.h, s.w)
    w = torch.randn(s.c_out, s.c_in // s.groups, s.kh, s.kw) / (s.c_in // s.groups * s.kh * s.kw) ** 0.5
    out = torch.full((s.n, s.c_out, *s.out_hw), float("nan"))
    args, made = _extras(case, out.shape)
    call(lib, s.name, x, w, out, *args, nthreads=case.nthreads)
    torch.testing.assert_close(out, _reference(case, x, w, made), rtol=1e-4, atol=1e-4)


def test_conv_spec_validates() -> None:
    with pytest.raises(ValueError, match="groups"):
        ConvSpec("bad", 1, 6, 8, 8, 4, 3, 3, groups=4)
    with pytest.raises(ValueError, match="empty"):
        ConvSpec("bad", 1, 3, 2, 2, 4, 5, 5)


@pytest.mark.parametrize(
    ("unit", "march"),
    [
        (VectorUnit(16, 32), "-mno-avx512f"),
        (VectorUnit(8, 16), "-march=x86-64-v3"),
        (VectorUnit(4, 16), "-march=x86-64"),
    ],
    ids=["avx512-tile-without-avx512", "avx2", "generic"],
)
@pytest.mark.parametrize("stride", [1, 2])
def test_other_tiers(build, call, unit: VectorUnit, march: str, stride: int) -> None:
    """Another tier's width and tile (the direct path; stride 2 over phase planes): same numbers."""
    s = ConvSpec(f"conv_tier{unit.lanes}_{stride}", 1, 5, 9, 11, 6, 3, 3, (stride, stride), (1, 1), unit=unit)
    lib = build(render_conv2d(s, E.bias_relu("c")), (march,))
    x, w, bias = torch.randn(1, 5, 9, 11), torch.randn(6, 5, 3, 3) / 6.7, torch.randn(6)
    want = F.relu(F.conv2d(x, w, bias, stride=stride, padding=1))
    out = torch.empty_like(want)
    call(lib, s.name, x, w, out, bias)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2])
def test_weight_packed_once_per_call(build, call, groups: int) -> None:
    """Several images share the weight, packed once per call for all of them (conv.py
    _packed_weight): ragged MR slivers (14 rows of 8), K blocks of 48 over K = 360 (the last
    short), 3 threads over 3 images; a second call with another weight must use that weight."""
    blk = Blocking(mr=8, nr=48, mc=16, kc=48, nc=96, lanes=16)
    s = ConvSpec(f"packed_once_g{groups}", 3, 40, 11, 9, 14 * groups, 3, 3, (2, 2), (1, 1), groups=groups, blocking=blk)
    lib = build(render_conv2d_gemm(s, E.bias_relu("c")))  # strided convs render direct unless asked
    x = torch.randn(s.n, s.c_in, s.h, s.w)
    for seed in (1, 2):
        torch.manual_seed(seed)
        w, bias = torch.randn(s.c_out, s.c_in // groups, 3, 3) / 19.0, torch.randn(s.c_out)
        out = torch.full((s.n, s.c_out, *s.out_hw), float("nan"))
        call(lib, s.name, x, w, out, bias, nthreads=3)
        want = F.relu(F.conv2d(x, w, bias, stride=2, padding=1, groups=groups))
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


PHASED = {
    # (n, c_in, h, w, c_out, kh, kw, stride, padding, dilation, groups): column strides > 1
    "s2_dilated": (2, 5, 13, 11, 9, 3, 3, (2, 2), (2, 1), (2, 2), 1),
    "s1x3_2x4": (2, 4, 7, 17, 6, 2, 4, (1, 3), (0, 2), (1, 1), 1),
    "s3_1x1": (1, 6, 10, 10, 7, 1, 1, (3, 3), (0, 0), (1, 1), 1),
    "s2_7x7_tiny": (3, 3, 5, 6, 8, 7, 7, (2, 2), (3, 3), (1, 1), 1),
    "s2_groups3": (2, 6, 9, 12, 9, 3, 3, (2, 2), (1, 1), (1, 1), 3),
    "s2_pad_rows_only": (1, 3, 11, 12, 5, 3, 2, (2, 2), (1, 0), (1, 2), 1),
}


@pytest.mark.parametrize("march", ["-march=native", "-march=x86-64-v3"], ids=["native", "avx2"])
@pytest.mark.parametrize("name", list(PHASED))
def test_column_strided_convs_read_phases(build, call, name: str, march: str) -> None:
    """Column strides > 1, both paths: the implicit GEMM gathers im2col from the padded column phases
    (conv_phases.py), the direct path reads 2-D phase planes (conv_direct.py): odd strides,
    dilation, padding wider than the kernel's reach, outputs of one column; built for AVX2 too
    (g++ 12 -O3 miscompiled a first form of the phase copy there only)."""
    n, c, h, w, o, kh, kw, stride, padding, dilation, groups = PHASED[name]
    unit = VectorUnit(8, 16) if "v3" in march else VectorUnit(16, 32)
    s = ConvSpec(f"phased_{name}", n, c, h, w, o, kh, kw, stride, padding, dilation, groups, unit=unit)
    d = replace(s, name=f"direct_{name}")
    src = render_conv2d_gemm(s, E.bias("c")) + render_conv2d(d, E.bias("c"))
    assert f"{s.name}_phases(" in src and "phase plane" in src
    lib = build(src, (march,))
    torch.manual_seed(3)
    x, wt, bias = torch.randn(n, c, h, w), torch.randn(o, c // groups, kh, kw) / 5.0, torch.randn(o)
    want = F.conv2d(x, wt, bias, stride, padding, dilation, groups)
    for spec in (s, d):
        out = torch.full((n, o, *s.out_hw), float("nan"))
        call(lib, spec.name, x, wt, out, bias, nthreads=2)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
