"""C++ shared by every GEMM/conv kernel: includes, vectorizable math, per-thread scratch.

Emitted at the top of each rendered kernel behind an include guard, so one translation unit can
hold many kernels (the codegen engineer concatenates them) and each rendered string still
compiles on its own.
"""

from __future__ import annotations

from vfuse.codegen.cpp.gelu_monic import monic_pq
from vfuse.codegen.cpp.simd import SIMD_PRELUDE

# Why hand-written math: with plain `-O3 -march=native` (no -ffast-math) GCC calls scalar
# erff/expf/tanhf inside an `omp simd` loop, which would make the epilogue cost more than the
# GEMM for small K. These are branch-free polynomial/rational forms (Cephes exp, Eigen's erf and
# tanh) built from arithmetic, rounding and bit casts only, so GCC inlines and vectorizes them.
# Accuracy: a few ulp of the result (erf, tanh absolute error < 2e-7), far inside rtol 1e-4.
_MATH = (
    r"""
// Ternaries, not std::fmin/fmax: those must honour NaN rules and stay library calls.
static inline float vg_clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

static inline float vg_exp(float x) {
  x = vg_clamp(x, -87.3365f, 88.3762f);
  // Round to nearest by the 1.5*2^23 trick: std::floor only vectorizes under -fno-trapping-math.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = (static_cast<std::int32_t>(n) + 127) << 23;
  return p * __builtin_bit_cast(float, e);
}

static inline float vg_erf(float x) {
  x = vg_clamp(x, -4.0f, 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return x * p / q;
}

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)  // x86-64-v3 and up; every AArch64 core
static inline float vg_fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
static inline float vg_fmaf(float a, float b, float c) { return a * b + c; }
#endif

// tanh and tanh-form GELU in the row kernels' forms (codegen/cpp/prelude.py vf_tanh /
// vf_gelu_tanh, restated here so a GEMM renders on its own): one exp reduction and one division
// instead of a 7 + 4 term rational (16 operations fewer per vector). e^r - 1 on |r| <= ln2 / 2:
static inline float vg_expm1_reduced(float x, float n) {
  float r = vg_fmaf(-n, 0.693359375f, x);  // n * C1 is exact: one rounding, as x - n * C1
  r = vg_fmaf(n, 2.12194440e-4f, r);
  const float r2 = r * r;
  const float a = vg_fmaf(1.6666521132e-01f, r, 4.9999994040e-01f);
  const float b = vg_fmaf(8.3687156439e-03f, r, 4.1668388993e-02f);
  return vg_fmaf(vg_fmaf(r2, vg_fmaf(1.3814602280e-03f, r2, b), a), r2, r);
}

static inline std::uint32_t vg_f2bits(float f) { return __builtin_bit_cast(std::uint32_t, f); }
static inline float vg_bits2f(std::uint32_t u) { return __builtin_bit_cast(float, u); }

// tanh(x) = sign(x) t / (t + 2), t = expm1(2a), a = min(|x|, 9.1) (tanh(9.1) rounds to 1; NaN
// passes the compare); big's low bits << 23 are 2^n; n = 0 near 0, where t = q keeps tanh's
// relative accuracy. The sign is or-ed back: tanh(-0) = -0, tanh(+-inf) = +-1.
static inline float vg_tanh(float x) {
  const std::uint32_t xb = vg_f2bits(x), ab = xb & 0x7fffffffu;
  const float ax = vg_bits2f(ab), a = 9.1f < ax ? 9.1f : ax;
  const float m = a + a, k = 12583039.0f;  // 1.5 * 2^23 + 127
  const float big = vg_fmaf(m, 1.44269504088896341f, k);
  const float q = vg_expm1_reduced(m, big - k);
  const float s = vg_bits2f(vg_f2bits(big) << 23);
  const float t = vg_fmaf(s, q, s - 1.0f);
  return vg_bits2f(vg_f2bits(t / (t + 2.0f)) | (xb ^ ab));
}

// 1 + exp(-x), x >= -88.376 or the result is +inf (2^n capped at n = 128, whose bits are +inf).
static inline float vg_one_plus_exp_neg(float x) {
  const float m = -x, k = 12583039.0f;
  const std::int32_t b = static_cast<std::int32_t>(vg_f2bits(vg_fmaf(m, 1.44269504088896341f, k)));
  const float big = vg_bits2f(static_cast<std::uint32_t>(b < 0x4b4000ff ? b : 0x4b4000ff));
  const float q = vg_expm1_reduced(m, big - k);
  return vg_fmaf(q + 1.0f, vg_bits2f(vg_f2bits(big) << 23), 1.0f);
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), 2u = x (2k + 2kc x^2): no
// cancellation where tanh(u) is near -1; 2u capped at 88 as an integer (NaN stays in x).
static inline float vg_gelu_tanh(float x) {
  const float v = x * vg_fmaf(0.0713548162726f, x * x, 1.5957691216057308f);
  const std::int32_t b = static_cast<std::int32_t>(vg_f2bits(v));
  return x / vg_one_plus_exp_neg(vg_bits2f(static_cast<std::uint32_t>(b < 0x42b00000 ? b : 0x42b00000)));
}

static inline float vg_sigmoid(float x) { return 1.0f / (1.0f + vg_exp(-x)); }

// GELU, erf form. With an fma: the row kernels' vf_gelu_none (codegen/cpp/prelude.py), restated: for
// a = min(|x|, 5.6) and w = a^2, erf(a / sqrt2) / 2 = a P(w) / Q(w), P monic (its innermost Estrin
// step an add), gelu = |x| e + x / 2: 14 FMA-pipe operations per vector where vg_erf's form took 15
// (llvm-mca znver3: 13.8 cycles per vector, not 18.4). Without an fma, vg_erf's form as before (bit
// for bit). Errors over every float of [-20, 20]: docs/perf-log.md (session 18, H3).
static inline float vg_gelu_erf(float x) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  const std::uint32_t ab = vg_f2bits(x) & 0x7fffffffu;
  const float ax = vg_bits2f(ab), a = vg_bits2f(ab < 0x40b33333u ? ab : 0x40b33333u);  // 5.6f
  const float w = a * a, w2 = w * w;
"""
    + monic_pq("vg_fmaf")
    + r"""  return vg_fmaf(ax, a * p / q, 0.5f * x);
#else
  return 0.5f * x * (1.0f + vg_erf(x * 0.70710678118654752f));
#endif
}
"""
)

# Why scratch lives in thread-local grow-only buffers: packing buffers are megabytes; a fresh
# malloc per call maps new pages and pays page faults on every call. thread_local gives each
# OpenMP worker its own A-panel buffer with no locking; slot 1 is the calling thread's shared
# B panel; slot 2 the fp32 partial sums of a GEMM whose output is not fp32 (an int8 C cannot
# hold them), shared like the B panel. Memory is returned at thread exit.
_SCRATCH = r"""
struct VgScratch {
  float* ptr[3] = {nullptr, nullptr, nullptr};
  std::size_t cap[3] = {0, 0, 0};
  ~VgScratch() { std::free(ptr[0]); std::free(ptr[1]); std::free(ptr[2]); }
};

static inline float* vg_scratch(int slot, std::size_t floats) {
  static thread_local VgScratch s;
  if (s.cap[slot] < floats) {
    std::free(s.ptr[slot]);
    const std::size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
    s.ptr[slot] = static_cast<float*>(std::aligned_alloc(64, bytes));
    s.cap[slot] = floats;
  }
  return s.ptr[slot];
}

static inline long vg_min(long a, long b) { return a < b ? a : b; }
"""


def render_prelude() -> str:
    """Includes, math helpers and scratch allocator, guarded so repeats in one TU are harmless."""
    return (
        "#ifndef VFUSE_GEMM_PRELUDE\n#define VFUSE_GEMM_PRELUDE\n"
        "#include <cmath>\n#include <cstddef>\n#include <cstdint>\n#include <cstdlib>\n"
        "#include <cstring>\n#include <omp.h>\n"
        f"{SIMD_PRELUDE}{_MATH}{_SCRATCH}#endif  // VFUSE_GEMM_PRELUDE\n"
    )
