"""fp32 log, log2, log10, log1p, expm1, exp2, sinh and cosh for the C++ prelude, without libm.

Why not libm: g++ vectorizes a loop calling libm only through glibc's vector math (libmvec), whose
vector bodies and scalar remainders differ in the last bits, so one value computed in two loops
could differ (a max's backward missed its recomputed maximum: session 24); called as plain libm the
loops stay scalar, 3x slower than eager's vectorized SLEEF (docs/perf-log.md, session 25). These
are plain arithmetic with -ffp-contract=off, so a scalar remainder computes the very bits of a
vector body, and they vectorize on every tier. Errors against float64 libm over every 257th float:
log 0.87, log2 1.72, log10 1.85, log1p 0.50, expm1 1.45 ulps (tests/codegen/test_libm_free.py).

- log, log2, log10 in float (16 lanes on AVX-512): x = 2^e m, m in [sqrt(1/2), sqrt(2)),
  log m = f - (f^2/2 - s (f^2/2 + R)), f = m - 1, s = f / (2 + f), R the atanh series (fdlibm's
  logf arrangement). The same in double was correctly rounded but 1.8x slower, behind eager.
- log1p in double: 1 + x is exact there for |x| >= 2^-29; below 2^-24 log1p(x) is x.
- expm1: 2^n (q + 1) - 1 in double from `vf_exp_m1`'s q = e^r - 1 (n = 0 near 0: q itself).
- exp2: 2^n e^(f ln2) with n = rint(x), f = x - n exact, through vf_exp's polynomial and scaling.
- sinh, cosh: from expm1 (sinh) and exp (cosh) below |x| = 9, as e^|x| / 2 = (q + 1) 2^(n - 1) above
  (no overflow before the result's).

sin and cos still call libm: a vectorizable Payne-Hanek reduction for large |x| (a table lookup by
the exponent) cost more than scalar libm here (3.6 against 1.8 ns an element); the cost model runs
them in torch where that is faster (fusion/libm.py).
"""

from __future__ import annotations

LIBM_FREE = r"""// ---- fp32 log, log2, log10, log1p, expm1, exp2, sinh, cosh without libm (prelude_math.py) ----
static inline uint64_t vf_d2bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
static inline double vf_bits2d(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
// log of a positive finite normal double (log1p's 1 + x): u = 2^e * m, m in [sqrt(1/2), sqrt(2)), log m =
// 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: 6 odd terms (truncation below 1e-10).
static inline double vf_log_core(double u, double& e) {
  const uint64_t i = vf_d2bits(u) - 0x3fe6a09e667f3bcdull;  // bits of sqrt(1/2)
  e = (double)((int32_t)((int64_t)i >> 52));
  const double m = vf_bits2d(vf_d2bits(u) - (i & 0xfff0000000000000ull));
  const double s = (m - 1.0) / (m + 1.0), z = s * s;
  return 2.0 * s * (1.0 + z * (1.0 / 3 + z * (1.0 / 5 + z * (1.0 / 7 + z * (1.0 / 9 + z * (1.0 / 11))))));
}
// log(x) = e * ln2 + log m; -inf at +-0, NaN below 0 and at NaN, +inf at +inf.
static inline float vf_log_select(float x, float v) {
  const uint32_t b = vf_f2bits(x);
  float y = b > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN() : v;
  y = b == 0x7f800000u ? std::numeric_limits<float>::infinity() : y;
  return (b & 0x7fffffffu) == 0 ? -std::numeric_limits<float>::infinity() : y;
}
// log m in float for x = 2^e m > 0 finite (subnormals scaled by 2^23 first), m in [sqrt(1/2),
// sqrt(2)): f = m - 1, s = f / (2 + f), log m = f - (f^2/2 - s (f^2/2 + R)), R the atanh series
// 2z/3 + 2z^2/5 + ... in z = s^2 (fdlibm's logf arrangement; 16 lanes where double had 8).
static inline float vf_logm(float x, float& e) {
  const uint32_t b = vf_f2bits(x);
  const bool sub = b < 0x00800000u;
  const uint32_t bs = sub ? vf_f2bits(x * 8388608.0f) : b;
  const uint32_t i = bs - 0x3f3504f3u;  // bits of sqrt(1/2)
  e = (float)((int32_t)i >> 23) - (sub ? 23.0f : 0.0f);
  const float f = vf_bits2f(bs - (i & 0xff800000u)) - 1.0f;
  const float s = f / (2.0f + f), z = s * s, h = 0.5f * f * f;
  const float r = z * (0.66666667f + z * (0.4f + z * (0.28571429f + z * 0.22222222f)));
  return f - (h - s * (h + r));
}
static inline float vf_log(float x) {
  float e;
  const float l = vf_logm(x, e);
  return vf_log_select(x, e * 0.693359375f + (l + e * -2.12194440e-4f));  // ln2 in two parts
}
static inline float vf_log2(float x) {
  float e;
  const float l = vf_logm(x, e);
  return vf_log_select(x, e + l * 1.44269504f);
}
static inline float vf_log10(float x) {
  float e;
  const float l = vf_logm(x, e);
  return vf_log_select(x, e * 0.30102539f + (l * 0.43429448f + e * 4.6050389e-06f));  // log10(2) in two parts
}
// log1p: 1 + x is exact in double for |x| >= 2^-29; below 2^-24 log1p(x) = x - x^2/2 rounds to x.
static inline float vf_log1p(float x) {
  double e;
  const double l = vf_log_core(1.0 + (double)x, e);
  const uint32_t b = vf_f2bits(x);
  float y = (b & 0x7fffffffu) < 0x33800000u ? x : (float)(e * 0.69314718055994531 + l);  // |x| < 2^-24: x
  y = b > 0xbf800000u ? std::numeric_limits<float>::quiet_NaN() : y;  // below -1, -NaN
  y = b == 0xbf800000u ? -std::numeric_limits<float>::infinity() : y;
  return (b & 0x7fffffffu) >= 0x7f800000u && b != 0xff800000u ? x : y;  // +inf, NaN
}
// expm1 = 2^n (q + 1) - 1, q = e^r - 1 from vf_exp_m1 (accurate for small r: n = 0 near 0), in double.
static inline float vf_expm1(float x) {
  int32_t kk;
  const float q = vf_exp_m1(x, kk);  // kk = n + 254
  const double t = vf_bits2d((uint64_t)(int64_t)(kk - 254 + 1023) << 52);
  const float y = (float)((double)q * t + (t - 1.0));
  float z = x > 89.0f ? std::numeric_limits<float>::infinity() : y;  // past vf_exp_m1's range
  z = (vf_f2bits(x) & 0x7fffffffu) < 0x33000000u ? x : z;  // |x| < 2^-25: x, -0 kept
  return x < -20.0f ? -1.0f : z;
}
// exp2 = 2^n e^(f ln2), n = rint(x), f = x - n exact (|f| <= 1/2): vf_exp's polynomial and scaling.
static inline float vf_exp2(float x) {
  const float big = x + 12582912.0f;  // rint by the 1.5*2^23 trick, as in vf_exp_m1
  const int32_t kk = (int32_t)(vf_f2bits(big) - (0x4b400000u - 254u));
  const float y = vf_scale2(vf_expm1_poly((x - (big - 12582912.0f)) * 0.693147181f) + 1.0f, kk);
  const float z = x >= 128.0f ? std::numeric_limits<float>::infinity() : y;
  return x < -150.0f ? 0.0f : z;
}
// e^a / 2 for 0 <= a <= 89.5, without overflow below FLT_MAX: vf_exp's (q + 1) 2^(n - 1).
static inline float vf_half_exp(float a) {
  int32_t kk;
  const float p = vf_exp_p(a, kk);
  return vf_scale2(p, kk - 1);
}
// sinh: x below 2^-12 (x^3/6 is lost); (m + m / (m + 1)) / 2 with m = expm1(|x|) below 9; e^|x| / 2
// above (e^-|x| / 2 is below its last bit there); the sign of x.
static inline float vf_sinh(float x) {
  const float a = std::fabs(x);
  const float m = vf_expm1(a < 9.0f ? a : 0.0f);
  float y = a < 9.0f ? 0.5f * (m + m / (m + 1.0f)) : vf_half_exp(a < 89.5f ? a : 0.0f);
  y = a >= 89.5f ? std::numeric_limits<float>::infinity() : y;
  y = a < 2.44140625e-4f ? a : y;
  y = vf_bits2f(vf_f2bits(y) | (vf_f2bits(x) & 0x80000000u));
  return a != a ? x : y;  // NaN
}
// cosh: (e + 1/e) / 2 with e = exp(|x|) below 9, e^|x| / 2 above.
static inline float vf_cosh(float x) {
  const float a = std::fabs(x);
  const float e = vf_exp(a < 9.0f ? a : 0.0f);
  float y = a < 9.0f ? 0.5f * (e + 1.0f / e) : vf_half_exp(a < 89.5f ? a : 0.0f);
  y = a >= 89.5f ? std::numeric_limits<float>::infinity() : y;
  return a != a ? x : y;  // NaN
}
"""
