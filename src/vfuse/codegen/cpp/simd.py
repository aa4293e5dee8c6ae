"""One vector vocabulary for the hand-written kernel families (GEMM, conv, flash attention, byte tables).

The kernels are written once with GCC/Clang vector extensions (`vs_f32x<W>`: W fp32 lanes) at
the width the schedule chose (`Target.simd_lanes`, with the register tile), so the tile shape and
the vector width come from one decision. g++ emits plain vector instructions for them on every
tier: AVX-512 zmm, AVX2 ymm (FMA from `a * b + c`: g++ contracts by default, also with
-std=c++17), NEON q registers, SSE2 on generic x86-64. A width the -march lacks still compiles
and is correct (g++ splits it into native vectors), only slower.

Only what the extensions cannot say goes through small per-tier forms next to the family that
needs them, each with a scalar generic form: byte lookups (table.py: AVX-512 VBMI vpermi2b, AVX2
vpshufb on nibbles, NEON tbl), masked im2col loads (gemm/microkernel.py, AVX-512 only).
See docs/gemm.md ("One source per family").
"""

from __future__ import annotations

SIMD_WIDTHS = (4, 8, 16)  # fp32 lanes: SSE / NEON, AVX2, AVX-512


def vtype(lanes: int) -> str:
    """The C++ fp32 vector type of `lanes` lanes (declared by SIMD_PRELUDE)."""
    if lanes not in SIMD_WIDTHS:
        raise ValueError(f"no vector type of {lanes} fp32 lanes (have {SIMD_WIDTHS})")
    return f"vs_f32x{lanes}"


def _types() -> str:
    lines = []
    for w in SIMD_WIDTHS:
        # may_alias: the kernels read float buffers through these types (as __m512 does).
        lines.append(f"typedef float vs_f32x{w} __attribute__((vector_size({4 * w}), may_alias));")
        lines.append(f"typedef int32_t vs_i32x{w} __attribute__((vector_size({4 * w}), may_alias));")
    lines.append("// The same vectors at any float address (unaligned loads and stores: vmovups, ldr q).")
    lines.append("template <int BYTES> struct VsUnaligned;")
    for w in SIMD_WIDTHS:
        lines.append(
            f"template <> struct VsUnaligned<{4 * w}> {{ "
            f"typedef float T __attribute__((vector_size({4 * w}), aligned(4), may_alias)); }};"
        )
    return "\n".join(lines)


SIMD_PRELUDE = (
    r"""#ifndef VS_SIMD_H
#define VS_SIMD_H
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif
// The helpers below are static inline: a vector wider than the -march's registers changes no ABI that matters.
#pragma GCC diagnostic ignored "-Wpsabi"
"""
    + _types()
    + r"""

// Unaligned load / store; aligned accesses dereference the pointer. (Not memcpy: g++ for AArch64 then
// moves the bytes through general registers.)
template <class V> static inline V vs_loadu(const float* p) {
  return *reinterpret_cast<const typename VsUnaligned<sizeof(V)>::T*>(p);
}
template <class V> static inline void vs_storeu(float* p, V v) {
  *reinterpret_cast<typename VsUnaligned<sizeof(V)>::T*>(p) = v;
}
// x - 0 is x for every x (x + 0 is not: -0 + 0 = +0), so g++ folds it to one broadcast.
template <class V> static inline V vs_splat(float x) { return x - V{}; }

// The vector width the -march has (bytes): what fits one register.
#if defined(__AVX512F__)
#define VS_NATIVE_BYTES 64
#elif defined(__AVX__)
#define VS_NATIVE_BYTES 32
#else
#define VS_NATIVE_BYTES 16
#endif
// Keep `x` in a register: g++ otherwise folds a vector loaded once and used by several FMAs back into
// each of them as a memory operand, which makes a register-tiled loop bound by loads (measured: P @ V
// of the attention kernel 25% slower). An empty asm that may change the register is opaque to that.
template <class V> static inline void vs_keep(V& x) {
#if defined(__x86_64__)
  if constexpr (sizeof(V) <= VS_NATIVE_BYTES) __asm__("" : "+v"(x));
#elif defined(__aarch64__)
  if constexpr (sizeof(V) <= VS_NATIVE_BYTES) __asm__("" : "+w"(x));
#else
  (void)x;
#endif
}
// max / min as x86 maxps / minps define them (`a > b ? a : b`: the second operand where either is NaN).
// g++ compiles the ternary to compare + blend, so each tier names its instruction.
template <class V> static inline V vs_max(V a, V b) { return a > b ? a : b; }
template <class V> static inline V vs_min(V a, V b) { return a < b ? a : b; }
#if defined(__AVX512F__)
static inline vs_f32x16 vs_max(vs_f32x16 a, vs_f32x16 b) { return _mm512_max_ps(a, b); }
static inline vs_f32x16 vs_min(vs_f32x16 a, vs_f32x16 b) { return _mm512_min_ps(a, b); }
#endif
#if defined(__AVX__)
static inline vs_f32x8 vs_max(vs_f32x8 a, vs_f32x8 b) { return _mm256_max_ps(a, b); }
static inline vs_f32x8 vs_min(vs_f32x8 a, vs_f32x8 b) { return _mm256_min_ps(a, b); }
#endif
#if defined(__SSE__)
static inline vs_f32x4 vs_max(vs_f32x4 a, vs_f32x4 b) { return _mm_max_ps(a, b); }
static inline vs_f32x4 vs_min(vs_f32x4 a, vs_f32x4 b) { return _mm_min_ps(a, b); }
#endif

// exp(x) = 2^n * e^r, n = round(x / ln2), r = x - n ln2 in two parts; e^r by a degree-6 Taylor
// polynomial (|r| <= 0.35: relative error ~1e-7). Rounding by the 1.5 * 2^23 trick: t = x / ln2 + 1.5 * 2^23
// holds n in its low mantissa bits, so t's bits shifted up by 23, plus 127 << 23, are the bits of 2^n
// (no float -> int conversion). Below -87.3 (and -inf) the result is 0: those bits hold n >= -126 only.
// NaN propagates as in torch: the clamp's bounds come first (maxps returns its second operand on NaN) and the
// final select tests `x < lo`, false for NaN.
template <class V> static inline V vs_exp(V x) {
  using I = decltype(x < x);
  const V lo = vs_splat<V>(-87.33654f);
  const V xc = vs_min(vs_splat<V>(88.3762626647949f), vs_max(lo, x));
  const V t = xc * 1.44269504088896341f + 12582912.0f;
  const V n = t - 12582912.0f;
  V r = xc - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  V p = vs_splat<V>(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const V scale = (V)(((I)t << 23) + 0x3f800000);
  return x < lo ? V{} : p * scale;
}

#endif  // VS_SIMD_H
"""
)
