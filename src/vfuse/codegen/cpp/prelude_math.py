"""fp32 log, log2, log10, log1p and expm1 for the C++ prelude, written without libm.

Why not libm: g++ vectorizes a loop calling libm only through glibc's vector math (libmvec), whose
vector bodies and scalar remainders differ in the last bits, so one value computed in two loops
could differ (a max's backward missed its recomputed maximum: session 24); called as plain libm the
loops stay scalar, 3x slower than eager's vectorized SLEEF (docs/perf-log.md, session 25). These
are plain arithmetic with -ffp-contract=off, so a scalar remainder computes the very bits of a
vector body, and they vectorize on every tier. They work in double where that makes them correctly
rounded in practice: over every 17th float the logs are within 0.501 ulp of float64 libm and expm1
within 1.46 ulp (tests/codegen/test_libm_free.py sweeps every 257th float).

- logs: x = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m - 1) / (m + 1)) in double.
  log1p takes 1 + x in double, exact for |x| >= 2^-29; below 2^-24 it is x.
- expm1: 2^n (q + 1) - 1 in double from `vf_exp_m1`'s q = e^r - 1 (n = 0 near 0: q itself).

sin and cos still call libm: a vectorizable Payne-Hanek reduction for large |x| (a table lookup by
the exponent) cost more than scalar libm here (3.6 against 1.8 ns an element).
"""

from __future__ import annotations

LIBM_FREE = r"""// ---- fp32 log, log2, log10, log1p, expm1 without libm (prelude_math.py) ----
static inline uint64_t vf_d2bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
static inline double vf_bits2d(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
// log of a positive finite normal double: u = 2^e * m, m in [sqrt(1/2), sqrt(2)), log m =
// 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: 6 odd terms (truncation below 1e-10).
static inline double vf_log_core(double u, double& e) {
  const uint64_t i = vf_d2bits(u) - 0x3fe6a09e667f3bcdull;  // bits of sqrt(1/2)
  e = (double)((int32_t)((int64_t)i >> 52));
  const double m = vf_bits2d(vf_d2bits(u) - (i & 0xfff0000000000000ull));
  const double s = (m - 1.0) / (m + 1.0), z = s * s;
  return 2.0 * s * (1.0 + z * (1.0 / 3 + z * (1.0 / 5 + z * (1.0 / 7 + z * (1.0 / 9 + z * (1.0 / 11))))));
}
// log(x) = e * ln2 + log m; -inf at +-0, NaN below 0 and at NaN, +inf at +inf.
static inline float vf_log_select(float x, double v) {
  const uint32_t b = vf_f2bits(x);
  float y = b > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN() : (float)v;
  y = b == 0x7f800000u ? std::numeric_limits<float>::infinity() : y;
  return (b & 0x7fffffffu) == 0 ? -std::numeric_limits<float>::infinity() : y;
}
static inline float vf_log(float x) {
  double e;
  const double l = vf_log_core((double)x, e);
  return vf_log_select(x, e * 0.69314718055994531 + l);
}
static inline float vf_log2(float x) {
  double e;
  const double l = vf_log_core((double)x, e);
  return vf_log_select(x, e + l * 1.4426950408889634);
}
static inline float vf_log10(float x) {
  double e;
  const double l = vf_log_core((double)x, e);
  return vf_log_select(x, e * 0.30102999566398120 + l * 0.43429448190325183);
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
"""
