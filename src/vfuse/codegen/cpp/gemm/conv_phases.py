"""Column-strided implicit-GEMM convs: the input de-interleaved into padded column phases.

Why: with a column stride SW > 1, each im2col row segment of a sliver reads every SW-th float of an
input row, clipped to the padding (`conv.py` `_im2col`): a strided gather per K row and run, ~1/6
of a 3x3 stride-2 conv's time at AVX2 (perf, 2x128x16x16 -> 256 channels), and more on a stem
conv whose K is small (3 -> 64 channels, 7x7: each gathered float feeds 64 output channels only).

Instead, per image (and group) and once per thread, each padded input row (PH / PW zeros around
the H x W plane) is stored as its SW column phases side by side: padded column col lives at
row * RW + (col % SW) * PWID + col / SW. An im2col segment, padded columns ow * SW + kw * DW for
consecutive ow, is then one contiguous run of one phase, with no padding to clip: a plain copy.
The copy costs one pass over the (padded) input, against K x N gathered floats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfuse.ir.sym import is_sym

if TYPE_CHECKING:
    from vfuse.codegen.cpp.gemm.conv import ConvSpec


def phased(spec: ConvSpec) -> bool:
    """Whether the implicit GEMM reads this conv's input through column phases: a column stride > 1
    (stride 1 has contiguous segments already, and its own path: conv_direct.py / the table), over
    constant planes (the copy's per-thread buffer is sized for them; symbolic ones gather per row)."""
    return spec.stride[1] > 1 and not any(is_sym(d) for d in (spec.h, spec.w))


def _dims(spec: ConvSpec) -> tuple[int, int, int, int]:
    """Padded height, phase width, row floats (all phases) and plane floats of the phased copy."""
    (ph, pw), sw = spec.padding, spec.stride[1]
    hp, wp = spec.h + 2 * ph, spec.w + 2 * pw
    pwid = -(-wp // sw)
    return hp, pwid, sw * pwid, hp * sw * pwid


def phase_copy(spec: ConvSpec) -> str:
    """NAME_phases(x): one (image, group)'s Cg input planes -> the calling thread's phased copy."""
    hp, pwid, rw, plane = _dims(spec)
    ph, cg = spec.padding[0], spec.c_in // spec.groups
    total = cg * plane
    return f"""
static const float* {spec.name}_phases(const float* __restrict x) {{
  struct Buf {{ float* p = nullptr; ~Buf() {{ std::free(p); }} }};
  static thread_local Buf b;
  if (!b.p) b.p = static_cast<float*>(std::aligned_alloc(64, {-(-total * 4 // 64) * 64}));
  float* __restrict xs = b.p;
  for (long c = 0; c < {cg}; ++c)
    for (long r = 0; r < {hp}; ++r) {{
      float* __restrict row = xs + c * {plane} + r * {rw};
      const long h = r - {ph};
      if (h < 0 || h >= {spec.h}) {{
        for (long q = 0; q < {rw}; ++q) row[q] = 0.0f;
        continue;
      }}
      const float* __restrict src = x + (c * {spec.h} + h) * {spec.w};
{_phase_rows(spec, pwid)}    }}
  return xs;
}}
"""


def _phase_rows(spec: ConvSpec, pwid: int) -> str:
    """C++: one input row `src` -> its SW phases in `row`, each a zero run, a strided copy and a
    zero run of constant bounds. Why not one loop with a bounds test per column: g++ 12 -O3 at
    -march=x86-64-v3 miscompiled that form (wrong columns; -O2 and AVX-512 builds were right)."""
    sw, pw, out = spec.stride[1], spec.padding[1], ""
    for b in range(sw):
        # Phase b holds padded columns q * SW + b, input column q * SW + b - PW: in [0, W) for q in [lo, hi).
        lo = min(pwid, max(0, -(-(pw - b) // sw)))
        hi = max(lo, min(pwid, -(-(spec.w + pw - b) // sw)))
        d = f"row + {b * pwid}"
        out += f"      for (long q = 0; q < {lo}; ++q) ({d})[q] = 0.0f;\n"
        out += f"      for (long q = {lo}; q < {hi}; ++q) ({d})[q] = src[q * {sw} + {b - pw}];\n"
        out += f"      for (long q = {hi}; q < {pwid}; ++q) ({d})[q] = 0.0f;\n"
    return out


def phased_im2col(spec: ConvSpec, nr: int) -> str:
    """NAME_im2col over the phased copy: rows [pc, pc + kc) x columns [j, j + nr) -> one sliver."""
    _, pwid, rw, plane = _dims(spec)
    ow_n = spec.out_hw[1]
    (sh, sw), (dh, dw), kh, kw = spec.stride, spec.dilation, spec.kh, spec.kw
    return f"""
// Output columns of a sliver form a few runs along one output row; per K row, each run is one
// contiguous piece of one column phase of the phased copy (conv_phases.py), padding included.
static inline void {spec.name}_im2col(const float* __restrict xs, long pc, long kc, long j, long nr,
                                      float* __restrict bps) {{
  long run_c[{nr + 1}], run_oh[{nr}], run_ow[{nr}];
  int nrun = 0;
  for (long c = 0; c < nr; ++nrun) {{
    const long p = j + c, oh = p / {ow_n}, ow = p % {ow_n};
    run_c[nrun] = c; run_oh[nrun] = oh * {sh}; run_ow[nrun] = ow * {sw};
    c += vg_min({ow_n} - ow, nr - c);
  }}
  run_c[nrun] = nr;
  long ic = pc / {kh * kw}, kh = (pc / {kw}) % {kh}, kw = pc % {kw};
  for (long kk = 0; kk < kc; ++kk) {{
    float* __restrict dst = bps + kk * {nr};
    for (int r = 0; r < nrun; ++r) {{
      const long c0 = run_c[r], len = run_c[r + 1] - c0, col = run_ow[r] + kw * {dw};
      const long row = run_oh[r] + kh * {dh};
      const float* __restrict src = xs + ic * {plane} + row * {rw} + col % {sw} * {pwid} + col / {sw};
#pragma omp simd
      for (long q = 0; q < len; ++q) dst[c0 + q] = src[q];
    }}
    for (long q = nr; q < {nr}; ++q) dst[q] = 0.0f;
    if (++kw == {kw}) {{ kw = 0; if (++kh == {kh}) {{ kh = 0; ++ic; }} }}
  }}
}}
"""
