"""render_conv2d_folded: a conv with a small output plane as ONE GEMM over all its images
(C++17 source text); the weight-gradient template (`schedule/conv_fold.py` decides which convs).

A conv weight gradient dW[co, ci, a, b] = sum over (n, oh, ow) of dY[n, co, oh, ow] *
X[n, ci, oh*s + a*d - p, ow*s + b*d - p] is lowered to a conv over x with batch and channels
swapped, grad_output as the filters (`frontend/lower_conv_backward.py`): images = ci, input
channels = n, kernel = Ho x Wo, output plane = the kernel (kh x kw). Its per-image GEMM would
have kh*kw columns (9); here the images are folded into the columns:

    C[oc, (t, img)] = Wt (OC x IC*KH*KW) @ B,   B[(ic, ka, kb), (t, img)] = X[img, ic, ih, iw],
    ih = oh(t) * SH + ka * DH - PH,  iw = ow(t) * SW + kb * DW - PW  (zero outside X)

through the shared driver (`driver.py`: M = OC, N = IMG * OH*OW, K = IC*KH*KW; A is the weight
as stored, packed by vg_pack_a; with one MC block each thread packs its own column chunk). X is
first transposed into a scratch copy with the images innermost, so the B packer's columns
(consecutive images at one output pixel) are contiguous: per K row a sliver is one or two
plain copies (the window's origin is found once per sliver). C lands in a scratch OC x
OH*OW*IMG matrix, which one pass scatters to the NCHW output, applying the epilogue there
(names n, c, p, o as in `conv.py`). Scratch: X's size plus the output's, freed on return.

Symbolic sizes (a batch or planes known at run time, docs/dynamic.md) print as C++ over `vf_s0`
(`seeds[k]`): the entry takes `seeds` among the epilogue's arguments and hands it to the driver
(which picks its cache blocks per call, `ConvSpec.call`) and to the packers.

Generated signature (the conv template's):
    <linkage> void <name>(const float* X, const float* Wt, float* Y, <epilogue args>, int nthreads)
"""

from __future__ import annotations

from vfuse.codegen.cpp.gemm.blocking import Blocking, choose_blocking
from vfuse.codegen.cpp.gemm.conv import ConvSpec
from vfuse.codegen.cpp.gemm.driver import Driver, render_driver
from vfuse.codegen.cpp.gemm.epilogue import Epilogue, EpilogueArg
from vfuse.codegen.cpp.gemm.microkernel import PACKERS, render_microkernel
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.codegen.cpp.transpose import transpose_helper
from vfuse.ir.sym import is_sym
from vfuse.schedule.blocks import folded_passes

# Columns of X per transpose call: 64 x 4 bytes of each image's row, all images' in L1 at once.
_CHUNK = 64


def spec_mnk(spec: ConvSpec) -> tuple[int, int, int]:
    """The folded GEMM's M, N, K for `spec` (one GEMM per group)."""
    oh, ow = spec.out_hw
    g = spec.groups
    return spec.c_out // g, spec.n * oh * ow, spec.c_in // g * spec.kh * spec.kw  # schedule/conv_fold.folded_mnk


def folded_blocking(spec: ConvSpec) -> Blocking:
    return spec.blocking or choose_blocking(*spec_mnk(spec), *spec.caches, unit=spec.unit)


_SEEDS = EpilogueArg("seeds", "const int64_t*")


def sized(spec: ConvSpec) -> bool:
    """Whether some size of the conv is symbolic: read at run time through `seeds` (module doc)."""
    return any(is_sym(d) for d in (spec.n, spec.c_in, spec.h, spec.w, spec.kh, spec.kw))


def _seeds(spec: ConvSpec) -> tuple[str, str]:
    """(parameter, argument) fragments passing `seeds` to a helper of a symbolic conv, else empty."""
    return (f", {_SEEDS.decl()}", ", seeds") if sized(spec) else ("", "")


def row_runs(spec: ConvSpec) -> bool:
    """Whether a packed run spans a whole output row: with column stride 1 and no padding, the
    next pixel of a row reads the next column of xt, IMG floats on, so (ow, img) columns of one
    row are contiguous in xt and always inside X. Why: a run per pixel (IMG floats) split most
    slivers in two copies of a variable length, each a libc memmove call (~8 % of the stride-2
    Conv-BN-ReLU training step); along the row a sliver is mostly one run of exactly NR."""
    return spec.stride[1] == 1 and spec.padding == (0, 0)


def _packer(spec: ConvSpec, nr: int) -> str:
    """NAME_fold: rows [pc, pc + kc) x columns [j, j + nr) of B -> one packed NR-wide sliver.
    Columns are (t, img), read from X with the images innermost (`xt`, NAME's transpose): a
    sliver is a few runs of consecutive columns (one pixel's images, or a row's: `row_runs`),
    each K row one contiguous copy per run (a gather per element was half the GEMM's time at
    8x32x28x28); a sliver that is one whole run copies NR floats, a constant count (no call)."""
    ow_n = spec.out_hw[1]
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    h, w, kh, kw, img_n = spec.h, spec.w, spec.kh, spec.kw, spec.n
    run = ow_n * img_n if row_runs(spec) else img_n
    return f"""
static inline void {spec.name}_fold(const float* __restrict xt, long pc, long kc, long j, long nr,
                                    float* __restrict bps{_seeds(spec)[0]}) {{
  // Runs of columns in xt order: first column, first image, window origin of the first pixel.
  long run_c[{nr + 1}], run_img[{nr}], run_ih[{nr}], run_iw[{nr}];
  int nrun = 0;
  for (long c = 0; c < nr; ++nrun) {{
    const long col = j + c, t = col / {img_n}, img = col % {img_n};
    run_c[nrun] = c; run_img[nrun] = img;
    run_ih[nrun] = (t / {ow_n}) * {sh} - {ph}; run_iw[nrun] = (t % {ow_n}) * {sw} - {pw};
    c += vg_min({run} - col % {run}, nr - c);
  }}
  run_c[nrun] = nr;
  long ic = pc / {kh * kw}, ka = (pc / {kw}) % {kh}, kb = pc % {kw};
{_one_run(spec, nr) if row_runs(spec) else ""}  for (long kk = 0; kk < kc; ++kk) {{
    float* __restrict dst = bps + kk * {nr};
    for (int r = 0; r < nrun; ++r) {{
      const long ih = run_ih[r] + ka * {dh}, iw = run_iw[r] + kb * {dw};
      const long c0 = run_c[r], len = run_c[r + 1] - c0;
      float* __restrict d = dst + c0;
      if (ih >= 0 && ih < {h} && iw >= 0 && iw < {w}) {{
        const float* __restrict src = xt + ((ic * {h} + ih) * {w} + iw) * {img_n} + run_img[r];
#pragma omp simd
        for (long q = 0; q < len; ++q) d[q] = src[q];
      }} else {{
#pragma omp simd
        for (long q = 0; q < len; ++q) d[q] = 0.0f;
      }}
    }}
    for (long q = nr; q < {nr}; ++q) dst[q] = 0.0f;
    if (++kb == {kw}) {{ kb = 0; if (++ka == {kh}) {{ ka = 0; ++ic; }} }}
  }}
}}
"""


def _one_run(spec: ConvSpec, nr: int) -> str:
    """C++: a whole sliver that is one run (`row_runs`, always inside X): per K row NR floats from
    one offset, a fixed-count copy g++ emits as vector moves."""
    (dh, dw), h, w, kh, kw, img_n = spec.dilation, spec.h, spec.w, spec.kh, spec.kw, spec.n
    return f"""  if (nrun == 1 && nr == {nr}) {{
    const float* __restrict base = xt + (run_ih[0] * {w} + run_iw[0]) * {img_n} + run_img[0];
    for (long kk = 0; kk < kc; ++kk) {{
      const float* __restrict src = base + ((ic * {h} + ka * {dh}) * {w} + kb * {dw}) * {img_n};
      float* __restrict dst = bps + kk * {nr};
#pragma omp simd
      for (int q = 0; q < {nr}; ++q) dst[q] = src[q];
      if (++kb == {kw}) {{ kb = 0; if (++ka == {kh}) {{ ka = 0; ++ic; }} }}
    }}
    return;
  }}
"""


def _transpose(spec: ConvSpec, swapped: bool) -> str:
    """xt[(ic, hw), img] = X[img, ic, hw] through `vf_transpose_<block>` (register-block transposes,
    codegen/cpp/transpose.py), in column chunks whose rows of all images stay in L1 (the element
    loop it replaces was 17 % of the weight gradient's time at 4x64x56x56 stride 2); `swapped`:
    X's bytes are (ic, img, hw) (the weight gradient's x read in place), one transpose per ic."""
    img_n, plane, block = spec.n, spec.h * spec.w, _block(spec)
    if not swapped:
        rows = spec.c_in * plane
        return f"""#pragma omp parallel for num_threads(nth) schedule(static) if (par)
  for (long r0 = 0; r0 < {rows}; r0 += {_CHUNK}) {{
    vf_transpose_{block}<float>(X + r0, {rows}, xt + r0 * {img_n}, {img_n}, {img_n}, vg_min({_CHUNK}, {rows} - r0));
  }}
"""
    return f"""#pragma omp parallel for collapse(2) num_threads(nth) schedule(static) if (par)
  for (long ic = 0; ic < {spec.c_in}; ++ic) {{
    for (long r0 = 0; r0 < {plane}; r0 += {_CHUNK}) {{
      const float* __restrict src = X + ic * {img_n * plane} + r0;
      float* __restrict dst = xt + (ic * {plane} + r0) * {img_n};
      vf_transpose_{block}<float>(src, {plane}, dst, {img_n}, {img_n}, vg_min({_CHUNK}, {plane} - r0));
    }}
  }}
"""


def _block(spec: ConvSpec) -> int:
    """The register block of the transposes: the tier's 8x8 shuffles, 4x4 below 8 lanes (as the
    schedule's tiled transposes take them, schedule/transpose.py). The blocking's lanes are the
    tier's (the schedule's); the spec's `unit` may be left at its default."""
    return 8 if folded_blocking(spec).lanes >= 8 else 4


def _pack_a_swapped(spec: ConvSpec, mr: int) -> str:
    """NAME_pack_a: rows [i0, i0 + mc) x K [pc, pc + kc) of the weight read from its bytes
    (ic, oc, taps) (the weight gradient's grad_output in place), as vg_pack_a lays them out:
    per input channel, a row's taps are contiguous."""
    taps, oc_n = spec.kh * spec.kw, spec.c_out
    return f"""
static inline void {spec.name}_pack_a(const float* __restrict g, long i0, long mc, long pc, long kc,
                                      float* __restrict ap{_seeds(spec)[0]}) {{
  for (long ir = 0; ir < mc; ir += {mr}, ap += {mr} * kc) {{
    const long mr = vg_min({mr}, mc - ir);
    for (long kk = 0; kk < kc;) {{
      const long k = pc + kk, icn = k / {taps}, t = k % {taps}, len = vg_min({taps} - t, kc - kk);
      for (long r = 0; r < {mr}; ++r) {{
        const float* __restrict src = g + (icn * {oc_n} + i0 + ir + r) * {taps} + t;
        float* __restrict d = ap + kk * {mr} + r;
        if (r < mr) for (long q = 0; q < len; ++q) d[q * {mr}] = src[q];
        else for (long q = 0; q < len; ++q) d[q * {mr}] = 0.0f;
      }}
      kk += len;
    }}
  }}
}}
"""


def _scatter(spec: ConvSpec, epilogue: Epilogue, swapped: bool) -> str:
    """The entry: X transposed to images-innermost, the GEMM into scratch, then C[oc, (t, img)] ->
    Y[img, oc, t] with the epilogue (C's rows: every group's output channels)."""
    m, n_cols = spec.c_out, spec_mnk(spec)[1]
    plane, img_n, rows = spec.out_hw[0] * spec.out_hw[1], spec.n, spec.c_in * spec.h * spec.w
    # Threads where the schedule gave them (ConvSpec.blocks); outside a Program, its rule.
    b = spec.blocks or folded_passes(img_n * rows, m * n_cols)
    par, scatter = ("nth > 1" if t else "false" for t in (b.threaded_transpose, b.threaded_scatter))
    return f"""
{spec.linkage} void {spec.name}(const float* __restrict X, const float* __restrict Wt,
    float* __restrict Y{epilogue.params()}, int nthreads) {{
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  const bool par = {par};
  float* xt = static_cast<float*>(std::malloc(sizeof(float) * {img_n * rows}));
  float* tmp = static_cast<float*>(std::malloc(sizeof(float) * {m * n_cols}));
{_transpose(spec, swapped)}  {spec.name}_g(xt, Wt, tmp{_seeds(spec)[1]}, nthreads);
  // Channel-major: tmp's row c (OH*OW x IMG) stays in L1 while the output lines it fills, one
  // per image, are completed by the next channels (image-major swept tmp once per image: 2 MB
  // at 2x256x8x8 -> 256, 4x slower than torch).
#pragma omp parallel for num_threads(nth) schedule(static) if ({scatter})
  for (long c = 0; c < {m}; ++c) {{
    for (long n = 0; n < {img_n}; ++n) {{
      const float* __restrict src = tmp + c * {n_cols} + n;
      float* __restrict dst = Y + (n * {m} + c) * {plane};
#pragma omp simd
      for (long p = 0; p < {plane}; ++p) {{
        [[maybe_unused]] const long o = (n * {m} + c) * {plane} + p;
        float v = src[p * {img_n}];
{epilogue.code("        ")}        dst[p] = {epilogue.store};
      }}
    }}
  }}
  std::free(tmp);
  std::free(xt);
}}
"""


def _group_setup(spec: ConvSpec) -> str:
    """The driver's batch entry `bi`: group bi's weight rows, X's channels (`x_g`, in xt) and C's rows."""
    if spec.groups == 1:
        return "  const float* __restrict a_b = Wt;\n  const long co = 0;\n  float* __restrict c_b = Y;\n"
    m, n_cols, k = spec_mnk(spec)
    x_group = spec.c_in // spec.groups * spec.h * spec.w * spec.n
    return (
        f"  const float* __restrict a_b = Wt + bi * {m * k};\n"
        f"  const float* __restrict x_g = X + bi * {x_group};\n"
        f"  const long co = bi * {m * n_cols};\n  float* __restrict c_b = Y + co;\n"
    )


def render_conv2d_folded(spec: ConvSpec, epilogue: Epilogue, swapped: bool = False) -> str:
    """The kernel's C++ source (module doc). fp32 output (the epilogue's store is a float); with
    several groups, one GEMM per group (the driver's batch entries: A's rows and X's channels of
    the group, C's rows from the group's first output channel).
    `swapped`: X and Wt are given as the bytes of tensors with their first two dims exchanged
    ((IC, IMG, H, W) and (IC, OC, KH, KW): the weight gradient's x and grad_output, no copies)."""
    if swapped and spec.groups != 1:
        raise ValueError(f"{spec.name}: the folded conv reads swapped operands of one group, got {spec.groups}")
    if sized(spec) and (spec.blocking is None or spec.blocks is None or _SEEDS not in epilogue.args):
        raise ValueError(f"{spec.name}: symbolic sizes need the schedule's blocks and `seeds` among the arguments")
    m, n_cols, k = spec_mnk(spec)
    blk = folded_blocking(spec)
    seeds = _seeds(spec)[1]
    driver = Driver(
        name=f"{spec.name}_g",
        linkage="static",
        params="const float* __restrict X, const float* __restrict Wt, float* __restrict Y",
        args="X, Wt, Y",
        batch=spec.groups,
        m=m,
        n=n_cols,
        k=k,
        lda=k,
        ldc=n_cols,
        batch_setup=_group_setup(spec),
        pack_b=f"{spec.name}_fold({'X' if spec.groups == 1 else 'x_g'}, pc, kc, j, nr, bps{seeds});",
        pack_a=f"{spec.name}_pack_a(a_b, ic, mcur, pc, kc, ap{seeds});" if swapped else "",
        call=spec.call,
    )
    header = f"// vfuse folded conv2d {spec.name}: {spec}, epilogue {epilogue.name}, {blk}\n"
    return (
        render_prelude()
        + transpose_helper(_block(spec))
        + "\n"
        + PACKERS
        + render_microkernel(blk.mr, blk.nr, blk.lanes)
        + _packer(spec, blk.nr)
        + (_pack_a_swapped(spec, blk.mr) if swapped else "")
        + header
        + render_driver(driver, blk, Epilogue(args=(_SEEDS,)) if seeds else Epilogue())
        + _scatter(spec, epilogue, swapped)
    )
