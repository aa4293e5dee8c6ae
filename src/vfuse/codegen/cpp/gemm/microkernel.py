"""The register-blocked micro-kernel and the A/B panel packers (C++ source text).

The micro-kernel computes one MR x NR tile of A_panel @ B_panel over KC steps entirely in
registers and stores it to a 64-byte-aligned tile buffer in L1; the caller's writeback then adds
the previous partial sum and applies the epilogue. Packed panels are zero-padded to MR / NR, so
the micro-kernel never needs edge cases.
"""

from __future__ import annotations


def _avx512_body(mr: int, nr: int) -> str:
    nv = nr // 16
    zero = "".join(f"  __m512 c{r}_{v} = _mm512_setzero_ps();\n" for r in range(mr) for v in range(nv))
    loads = "".join(f"    const __m512 b{v} = _mm512_load_ps(b + {16 * v});\n" for v in range(nv))
    fmas = ""
    for r in range(mr):
        fmas += f"    av = _mm512_set1_ps(a[{r}]);\n"
        fmas += "".join(f"    c{r}_{v} = _mm512_fmadd_ps(av, b{v}, c{r}_{v});\n" for v in range(nv))
    stores = "".join(f"  _mm512_store_ps(t + {r * nr + 16 * v}, c{r}_{v});\n" for r in range(mr) for v in range(nv))
    # Why the prefetch distance: 8 k-steps of B ahead (~1-2 KiB) hides L2 latency for the
    # B sliver when it does not fit L1 (KC large); A slivers are short and stay hot.
    return (
        f"{zero}  __m512 av;\n"
        f"  for (long k = 0; k < kc; ++k) {{\n"
        f"    _mm_prefetch(reinterpret_cast<const char*>(b + {8 * nr}), _MM_HINT_T0);\n"
        f"{loads}{fmas}    a += {mr};\n    b += {nr};\n  }}\n{stores}"
    )


def _portable_body(mr: int, nr: int) -> str:
    # Why plain loops: this path runs only without AVX-512 (AVX2 or older); GCC vectorizes the
    # inner column loop with whatever vector ISA -march gives it.
    return (
        f"  alignas(64) float acc[{mr}][{nr}] = {{}};\n"
        f"  for (long k = 0; k < kc; ++k) {{\n"
        f"    for (int r = 0; r < {mr}; ++r) {{\n"
        f"      const float av = a[r];\n"
        f"#pragma omp simd\n"
        f"      for (int q = 0; q < {nr}; ++q) acc[r][q] += av * b[q];\n"
        f"    }}\n    a += {mr};\n    b += {nr};\n  }}\n"
        f"  std::memcpy(t, acc, sizeof(acc));\n"
    )


def microkernel_name(mr: int, nr: int) -> str:
    return f"vg_ukr_{mr}x{nr}"


def render_microkernel(mr: int, nr: int) -> str:
    """`void vg_ukr_<mr>x<nr>(long kc, const float* a, const float* b, float* t)`, guarded."""
    if nr % 16:
        raise ValueError(f"nr must be a multiple of 16 (one zmm), got {nr}")
    if mr * (nr // 16) + nr // 16 + 1 > 32:
        raise ValueError(f"a {mr}x{nr} tile does not fit 32 vector registers")
    name = microkernel_name(mr, nr)
    guard = f"VG_UKR_{mr}X{nr}"
    params = "long kc, const float* __restrict a, const float* __restrict b, float* __restrict t"
    # Why noinline: inlined into the driver, the micro-kernel shares one register allocation
    # with the writeback, whose epilogue constants (GELU, quantize) GCC hoists into vector
    # registers; the 32 zmm accumulators then spill to the stack inside the K loop (figures in
    # docs/perf-log.md). One call per MR x NR x KC tile.
    sig = f"__attribute__((noinline)) static void {name}({params})"
    return (
        f"#ifndef {guard}\n#define {guard}\n"
        f"#if defined(__AVX512F__)\n{sig} {{\n{_avx512_body(mr, nr)}}}\n"
        f"#else\n{sig} {{\n{_portable_body(mr, nr)}}}\n#endif\n#endif  // {guard}\n"
    )


# Packers shared by every kernel (templates on the tile sizes, guarded once per TU).
PACKERS = r"""
#ifndef VG_PACKERS
#define VG_PACKERS
// A block (mc x kc, row-major, leading dim lda) -> MR-row slivers, k-major inside a sliver.
template <int MR>
static inline void vg_pack_a(const float* __restrict A, long lda, long mc, long kc, float* __restrict ap) {
  for (long ir = 0; ir < mc; ir += MR, ap += MR * kc) {
    const long mr = vg_min(MR, mc - ir);
    for (long r = 0; r < mr; ++r) {
      const float* __restrict src = A + (ir + r) * lda;
      for (long k = 0; k < kc; ++k) ap[k * MR + r] = src[k];
    }
    for (long r = mr; r < MR; ++r)
      for (long k = 0; k < kc; ++k) ap[k * MR + r] = 0.0f;
  }
}

// One NR-column sliver of B (kc x nr, B[k * ldb + j]) -> k-major, zero-padded to NR columns.
template <int NR>
static inline void vg_pack_b_rows(const float* __restrict B, long ldb, long kc, long nr, float* __restrict bp) {
  for (long k = 0; k < kc; ++k) {
    const float* __restrict src = B + k * ldb;
    float* __restrict dst = bp + k * NR;
    if (nr == NR) {
#pragma omp simd
      for (int q = 0; q < NR; ++q) dst[q] = src[q];
    } else {
      for (long q = 0; q < nr; ++q) dst[q] = src[q];
      for (long q = nr; q < NR; ++q) dst[q] = 0.0f;
    }
  }
}

// One NR-column sliver of a transposed B (B[j * ldb + k], nn.Linear's weight) -> same layout.
template <int NR>
static inline void vg_pack_b_cols(const float* __restrict B, long ldb, long kc, long nr, float* __restrict bp) {
  for (long q = 0; q < nr; ++q) {
    const float* __restrict src = B + q * ldb;
    for (long k = 0; k < kc; ++k) bp[k * NR + q] = src[k];
  }
  for (long q = nr; q < NR; ++q)
    for (long k = 0; k < kc; ++k) bp[k * NR + q] = 0.0f;
}

// im2col row segment: d[q] = row[base + q * SW] for q in [qlo, qhi), 0 elsewhere in [0, len).
// Why masked AVX-512 for stride 1: segments are short (a sliver splits at output-row ends), so
// a vectorized loop would spend most of its time in scalar tails; masked lanes never fault, so
// the padding columns (base < 0 or past the row) need no separate zero loops.
#if defined(__AVX512F__)
static inline __mmask16 vg_lanes(long lo, long hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 16 ? 16 : hi;
  return hi <= lo ? 0 : static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// One 16-lane piece of a stride-1 im2col row: dst[0..16) = plane[off..off+16) under masks.
struct VgSeg {
  long off, dst;
  __mmask16 load, store;
};
#endif

template <int SW>
static inline void vg_segment(float* __restrict d, const float* __restrict row, long base, long len, long qlo,
                              long qhi) {
#if defined(__AVX512F__)
  if (SW == 1) {
    for (long q0 = 0; q0 < len; q0 += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(vg_lanes(qlo - q0, qhi - q0), row + base + q0);
      _mm512_mask_storeu_ps(d + q0, vg_lanes(0, len - q0), v);
    }
    return;
  }
#endif
  for (long q = 0; q < qlo; ++q) d[q] = 0.0f;
#pragma omp simd
  for (long q = qlo; q < qhi; ++q) d[q] = row[base + q * SW];
  for (long q = qhi > qlo ? qhi : qlo; q < len; ++q) d[q] = 0.0f;
}
#endif  // VG_PACKERS
"""
