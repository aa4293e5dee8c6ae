"""render_conv2d_folded: a conv with a small output plane as ONE GEMM over all its images
(C++17 source text); the weight-gradient template (`schedule/conv_fold.py` decides which convs).

A conv weight gradient dW[co, ci, a, b] = sum over (n, oh, ow) of dY[n, co, oh, ow] *
X[n, ci, oh*s + a*d - p, ow*s + b*d - p] is lowered to a conv over x with batch and channels
swapped, grad_output as the filters (`frontend/lower_conv_backward.py`): images = ci, input
channels = n, kernel = Ho x Wo, output plane = the kernel (kh x kw). Its per-image GEMM would
have kh*kw columns (9); here the images are folded into the columns:

    C[oc, (img, t)] = Wt (OC x IC*KH*KW) @ B,   B[(ic, ka, kb), (img, t)] = X[img, ic, ih, iw],
    ih = oh(t) * SH + ka * DH - PH,  iw = ow(t) * SW + kb * DW - PW  (zero outside X)

through the shared driver (`driver.py`: M = OC, N = IMG * OH*OW, K = IC*KH*KW; A is the weight
as stored, packed by vg_pack_a; with one MC block each thread packs its own column chunk). The
B packer is an im2col of the transposed matrix: per sliver, each column's base offset and
window origin are computed once, then each K row is one masked gather of NR entries at a
shifted offset. C lands in a scratch OC x IMG*OH*OW matrix, which one pass scatters to the
NCHW output, applying the epilogue there (names n, c, p, o as in `conv.py`).

Generated signature (the conv template's):
    <linkage> void <name>(const float* X, const float* Wt, float* Y, <epilogue args>, int nthreads)
"""

from __future__ import annotations

from vfuse.codegen.cpp.gemm.blocking import Blocking, choose_blocking
from vfuse.codegen.cpp.gemm.conv import ConvSpec
from vfuse.codegen.cpp.gemm.driver import Driver, render_driver
from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.microkernel import PACKERS, render_microkernel
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.schedule.conv_fold import folded_mnk

# Scatter pass: threads only when the output is big enough to pay for a parallel region.
_PARALLEL_SCATTER = 1 << 15


def spec_mnk(spec: ConvSpec) -> tuple[int, int, int]:
    """The folded GEMM's M, N, K for `spec`."""
    oh, ow = spec.out_hw
    return folded_mnk((spec.n, spec.c_in, spec.h, spec.w), (spec.c_out, spec.c_in, spec.kh, spec.kw), (0, 0, oh, ow))


def folded_blocking(spec: ConvSpec) -> Blocking:
    return spec.blocking or choose_blocking(*spec_mnk(spec), *spec.caches, unit=spec.unit)


def _packer(spec: ConvSpec, nr: int) -> str:
    """NAME_fold: rows [pc, pc + kc) x columns [j, j + nr) of B -> one packed NR-wide sliver."""
    oh_n, ow_n = spec.out_hw
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    h, w, kh, kw = spec.h, spec.w, spec.kh, spec.kw
    plane = oh_n * ow_n
    return f"""
static inline void {spec.name}_fold(const float* __restrict x, long pc, long kc, long j, long nr,
                                    float* __restrict bps) {{
  // Per column: its image's offset and its window's origin (row, column), fixed for the sliver.
  long base[{nr}], ih0[{nr}], iw0[{nr}];
  for (long q = 0; q < {nr}; ++q) {{
    const long col = j + (q < nr ? q : 0), img = col / {plane}, t = col % {plane};
    ih0[q] = (t / {ow_n}) * {sh} - {ph};
    iw0[q] = (t % {ow_n}) * {sw} - {pw};
    base[q] = img * {spec.c_in * h * w} + ih0[q] * {w} + iw0[q];
  }}
  long ic = pc / {kh * kw}, ka = (pc / {kw}) % {kh}, kb = pc % {kw};
  for (long kk = 0; kk < kc; ++kk) {{
    float* __restrict dst = bps + kk * {nr};
    const long dy = ka * {dh}, dx = kb * {dw}, shift = ic * {h * w} + dy * {w} + dx;
#pragma omp simd
    for (long q = 0; q < {nr}; ++q) {{
      const long ih = ih0[q] + dy, iw = iw0[q] + dx;
      const bool in = q < nr && ih >= 0 && ih < {h} && iw >= 0 && iw < {w};
      dst[q] = in ? x[base[q] + shift] : 0.0f;
    }}
    if (++kb == {kw}) {{ kb = 0; if (++ka == {kh}) {{ ka = 0; ++ic; }} }}
  }}
}}
"""


def _scatter(spec: ConvSpec, epilogue: Epilogue) -> str:
    """The entry: the GEMM into scratch, then C[oc, (img, t)] -> Y[img, oc, t] with the epilogue."""
    m, n_cols, _ = spec_mnk(spec)
    plane = spec.out_hw[0] * spec.out_hw[1]
    return f"""
{spec.linkage} void {spec.name}(const float* __restrict X, const float* __restrict Wt,
    float* __restrict Y{epilogue.params()}, int nthreads) {{
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  float* tmp = static_cast<float*>(std::malloc(sizeof(float) * {m * n_cols}));
  {spec.name}_g(X, Wt, tmp, nthreads);
#pragma omp parallel for num_threads(nth) schedule(static) if ({m * n_cols} >= {_PARALLEL_SCATTER} && nth > 1)
  for (long n = 0; n < {spec.n}; ++n) {{
    for (long c = 0; c < {m}; ++c) {{
      const float* __restrict src = tmp + c * {n_cols} + n * {plane};
      float* __restrict dst = Y + (n * {m} + c) * {plane};
#pragma omp simd
      for (long p = 0; p < {plane}; ++p) {{
        [[maybe_unused]] const long o = (n * {m} + c) * {plane} + p;
        float v = src[p];
{epilogue.code("        ")}        dst[p] = {epilogue.store};
      }}
    }}
  }}
  std::free(tmp);
}}
"""


def render_conv2d_folded(spec: ConvSpec, epilogue: Epilogue) -> str:
    """The kernel's C++ source (module doc). One group, fp32 output (the epilogue's store is a float)."""
    if spec.groups != 1:
        raise ValueError(f"{spec.name}: the folded conv takes one group, got {spec.groups}")
    m, n_cols, k = spec_mnk(spec)
    blk = folded_blocking(spec)
    driver = Driver(
        name=f"{spec.name}_g",
        linkage="static",
        params="const float* __restrict X, const float* __restrict Wt, float* __restrict Y",
        args="X, Wt, Y",
        batch=1,
        m=m,
        n=n_cols,
        k=k,
        lda=k,
        ldc=n_cols,
        batch_setup="  const float* __restrict a_b = Wt;\n  const long co = 0;\n  float* __restrict c_b = Y;\n",
        pack_b=f"{spec.name}_fold(X, pc, kc, j, nr, bps);",
    )
    header = f"// vfuse folded conv2d {spec.name}: {spec}, epilogue {epilogue.name}, {blk}\n"
    return (
        render_prelude()
        + PACKERS
        + render_microkernel(blk.mr, blk.nr, blk.lanes)
        + _packer(spec, blk.nr)
        + header
        + render_driver(driver, blk, Epilogue())
        + _scatter(spec, epilogue)
    )
