"""The alternative the issue names: one OpenBLAS sgemm per cache-sized C tile, then the epilogue.

render_gemm_blas emits a function with exactly render_gemm's signature. Each OpenMP work item
is a TM x TN tile of C[b]: a single-threaded `scipy_cblas_sgemm` writes the tile (sized to stay
in L2), and the epilogue runs over it straight away, so C is still written to DRAM once.

Costs measured against render_gemm (docs/gemm.md): OpenBLAS repacks the K x TN slice of B for
every tile row, and it must be linked (`blas_link_flags()`); it also sets OpenBLAS's global
thread count to 1 so its threads do not fight ours. PyPI: scipy-openblas32 (symbols prefixed
`scipy_`).
"""

from __future__ import annotations

import math

from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.gemm import GemmSpec, batch_setup
from vfuse.codegen.cpp.gemm.prelude import render_prelude


def blas_link_flags() -> list[str]:
    """g++ flags to compile and link a TU holding render_gemm_blas kernels (needs scipy-openblas32)."""
    import scipy_openblas32  # imported lazily: only this optional path needs the package

    lib_dir = scipy_openblas32.get_lib_dir()
    return [
        f"-I{scipy_openblas32.get_include_dir()}",
        f"-L{lib_dir}",
        f"-Wl,-rpath,{lib_dir}",
        f"-l{scipy_openblas32.get_library()}",
    ]


def _tile_body(spec: GemmSpec, epilogue: Epilogue, tm: int, tn: int) -> str:
    lda, ldb, ldc = spec.lead
    trans = "CblasTrans" if spec.trans_b else "CblasNoTrans"
    b_tile = f"b_b + jc * {ldb}" if spec.trans_b else "b_b + jc"
    return f"""    const long mt = vg_min({tm}, {spec.m} - ic), nt = vg_min({tn}, {spec.n} - jc);
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, {trans}, mt, nt, {spec.k}, 1.0f, a_b + ic * {lda}, {lda},
                      {b_tile}, {ldb}, 0.0f, c_b + ic * {ldc} + jc, {ldc});
    for (long i = ic; i < ic + mt; ++i) {{
      float* __restrict crow = c_b + i * {ldc};
#pragma omp simd
      for (long j = jc; j < jc + nt; ++j) {{
        [[maybe_unused]] const long o = co + i * {ldc} + j;
        float v = crow[j];
{epilogue.code("        ")}        crow[j] = v;
      }}
    }}
"""


def render_gemm_blas(spec: GemmSpec, epilogue: Epilogue, tm: int = 256, tn: int = 512) -> str:
    """Same contract and signature as render_gemm, built on OpenBLAS tiles of tm x tn."""
    mt, nt = math.ceil(spec.m / tm), math.ceil(spec.n / tn)
    items = math.prod(spec.batch) * mt * nt
    params = "const float* __restrict A, const float* __restrict B, float* __restrict C" + epilogue.params()
    return f"""{render_prelude()}#include <cblas.h>
// vfuse gemm (OpenBLAS tiles) {spec.name}: {spec.m}x{spec.k} @ {spec.k}x{spec.n}, epilogue {epilogue.name}
{spec.linkage} void {spec.name}({params}, int nthreads) {{
  scipy_openblas_set_num_threads(1);
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1)
  for (long w = 0; w < {items}; ++w) {{
    const long bi = w / {mt * nt}, ic = (w / {nt}) % {mt} * {tm}, jc = w % {nt} * {tn};
    [[maybe_unused]] const long b = bi;
{batch_setup(spec)}{_tile_body(spec, epilogue, tm, tn)}  }}
}}
"""
