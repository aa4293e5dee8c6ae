"""The register-blocked micro-kernel and the A/B panel packers (C++ source text).

The micro-kernel computes one MR x NR tile of A_panel @ B_panel over KC steps entirely in
registers and stores it to a 64-byte-aligned tile buffer in L1; the caller's writeback then adds
the previous partial sum and applies the epilogue. Packed panels are zero-padded to MR / NR, so
the micro-kernel never needs edge cases.
"""

from __future__ import annotations

from vfuse.codegen.cpp.simd import vtype
from vfuse.codegen.cpp.transpose import block_rounds


def fma_step(mr: int, nv: int, lanes: int, a_off: int, indent: str = "    ") -> str:
    """One k step: c{r}_{v} += A[a_off + r] * b{v}. x86 broadcasts A from memory (vbroadcastss, a load
    uop, no register); AArch64 multiplies by a lane (fmla by element), so mr/lanes A registers serve
    all mr rows: 8x12 then fits NEON's 32 registers with 24 accumulators."""
    vt = vtype(lanes)
    x86 = ""
    for r in range(mr):
        x86 += f"{indent}av = vs_splat<{vt}>(a[{a_off + r}]);\n"
        x86 += "".join(f"{indent}c{r}_{v} += av * b{v};\n" for v in range(nv))
    if mr % lanes:
        return x86
    arm = "".join(f"{indent}const {vt} a{q} = vs_loadu<{vt}>(a + {a_off + lanes * q});\n" for q in range(mr // lanes))
    for r in range(mr):
        arm += "".join(f"{indent}c{r}_{v} += b{v} * a{r // lanes}[{r % lanes}];\n" for v in range(nv))
    return f"#if defined(__aarch64__)\n{{\n{arm}}}\n#else\n{x86}#endif\n"


def _body(mr: int, nr: int, lanes: int) -> str:
    """Straight-line code: mr x nr/lanes accumulators, nr/lanes B loads and mr broadcasts per k step."""
    nv, vt = nr // lanes, vtype(lanes)
    zero = "".join(f"  {vt} c{r}_{v} = {{}};\n" for r in range(mr) for v in range(nv))
    # vs_keep: else g++ folds each B load into its mr FMAs as a memory operand (AVX2's 4x24: 12 loads
    # instead of 3 per k step); one load per vector, held in a register.
    loads = "".join(
        f"    {vt} b{v} = *reinterpret_cast<const {vt}*>(b + {lanes * v});\n    vs_keep(b{v});\n" for v in range(nv)
    )
    acc = [(r, v) for r in range(mr) for v in range(nv)]
    stores = "".join(f"  *reinterpret_cast<{vt}*>(t + {r * nr + lanes * v}) = c{r}_{v};\n" for r, v in acc)
    # Why the prefetch distance: 8 k-steps of B ahead (~1-2 KiB) hides L2 latency for the
    # B sliver when it does not fit L1 (KC large); A slivers are short and stay hot.
    return (
        f"{zero}  [[maybe_unused]] {vt} av;\n"
        f"  for (long k = 0; k < kc; ++k) {{\n"
        f"    __builtin_prefetch(b + {8 * nr}, 0, 3);\n"
        f"{loads}{fma_step(mr, nv, lanes, 0)}    a += {mr};\n    b += {nr};\n  }}\n{stores}"
    )


def microkernel_name(mr: int, nr: int, lanes: int = 16) -> str:
    return f"vg_ukr_{mr}x{nr}_w{lanes}"


def check_tile(mr: int, nr: int, lanes: int, registers: int = 32) -> None:
    """A register tile must be whole vectors wide and fit the registers (accumulators, B, a broadcast)."""
    vtype(lanes)
    if nr % lanes:
        raise ValueError(f"nr must be a multiple of the vector width {lanes}, got {nr}")
    if mr < 1 or mr * (nr // lanes) + nr // lanes + 1 > registers:
        raise ValueError(f"a {mr}x{nr} tile of {lanes}-lane vectors does not fit {registers} vector registers")


def render_microkernel(mr: int, nr: int, lanes: int = 16) -> str:
    """`void vg_ukr_<mr>x<nr>_w<lanes>(long kc, const float* a, const float* b, float* t)`, guarded.
    Panels and the tile buffer are 64-byte aligned and nr is whole vectors: aligned vector accesses."""
    check_tile(mr, nr, lanes)
    name = microkernel_name(mr, nr, lanes)
    guard = f"VG_UKR_{mr}X{nr}_W{lanes}"
    params = "long kc, const float* __restrict a, const float* __restrict b, float* __restrict t"
    # Why noinline: inlined into the driver, the micro-kernel shares one register allocation
    # with the writeback, whose epilogue constants (GELU, quantize) GCC hoists into vector
    # registers; the 32 zmm accumulators then spill to the stack inside the K loop (figures in
    # docs/perf-log.md). One call per MR x NR x KC tile.
    sig = f"__attribute__((noinline)) static void {name}({params})"
    return f"#ifndef {guard}\n#define {guard}\n{sig} {{\n{_body(mr, nr, lanes)}}}\n#endif  // {guard}\n"


# Rows of a matrix -> k-major with the rows innermost (`vg_pack_t<R, W>`): an A sliver as the
# micro-kernel reads it, or a sliver of a transposed B (nn.Linear's weight). Why W x W register
# transposes: element by element, each float was a load and a 4-byte store MR floats from the last,
# about a quarter of a 512 x 1024 @ 1024 x 256 GEMM whose weight is packed per call (perf, AVX-512,
# 2 threads: 900 -> 768 us; torch 680). Where W does not divide R (AVX-512's 14 rows) the last block
# overlaps the one before and rewrites its values (a block of R % W lanes went through memory and
# general registers, g++'s partial vector stores: 773 us on the GEMM above, 755 overlapped). Fewer
# rows than W (AVX2's 6-row slivers) go in 4 x 4 blocks; fewer than 4, one by one. Not transpose.py's
# vf_transpose_W (same rounds): it copies R % W rows one by one and takes its sizes at run time.
def _pack_t_rows(w: int) -> str:
    """`vg_pack_t{w}_rows<R, R0>`: rows [R0, R) (R0 + w <= R) of the k-range [k0, k0 + w), in w x w
    blocks (the vector types are concrete: g++ ignores a vector_size that depends on a template
    parameter)."""
    return f"""
template <int R, int R0>
static inline void vg_pack_t{w}_rows(const float* __restrict src, long ld, long k0, float* __restrict dst) {{
  static_assert(R0 + {w} <= R, "a whole block");
  typedef float V __attribute__((vector_size({4 * w})));
  typedef float VU __attribute__((vector_size({4 * w}), aligned(4), may_alias));
  typedef int32_t M __attribute__((vector_size({4 * w})));
  V x[{w}], y[{w}];
#pragma GCC unroll {w}
  for (int i = 0; i < {w}; ++i) x[i] = *(const VU*)(src + (R0 + i) * ld + k0);
{block_rounds(w)}
#pragma GCC unroll {w}
  for (int i = 0; i < {w}; ++i) *(VU*)(dst + (k0 + i) * R + R0) = x[i];
  if constexpr (R0 + {2 * w} <= R)
    vg_pack_t{w}_rows<R, R0 + {w}>(src, ld, k0, dst);
  else if constexpr (R0 + {w} < R)
    vg_pack_t{w}_rows<R, R - {w}>(src, ld, k0, dst);  // overlaps the block before
}}
"""


_PACK_T = f"""{_pack_t_rows(8)}{_pack_t_rows(4)}
// dst[k * R + r] = src[r * ld + k] for r < R, k < kc.
template <int R, int W>
static inline void vg_pack_t(const float* __restrict src, long ld, long kc, float* __restrict dst) {{
  constexpr long B = W == 8 && R >= 8 ? 8 : (R >= 4 ? 4 : 1);
  long k0 = 0;
  for (; B > 1 && k0 + B <= kc; k0 += B) {{
    if constexpr (B == 8)
      vg_pack_t8_rows<R, 0>(src, ld, k0, dst);
    else if constexpr (B == 4)
      vg_pack_t4_rows<R, 0>(src, ld, k0, dst);
  }}
  for (; k0 < kc; ++k0)
    for (int r = 0; r < R; ++r) dst[k0 * R + r] = src[r * ld + k0];
}}
"""

# Packers shared by every kernel (templates on the tile sizes, guarded once per TU).
PACKERS = (
    r"""
#ifndef VG_PACKERS
#define VG_PACKERS
"""
    + _PACK_T
    + r"""// A block (mc x kc, row-major, leading dim lda) -> MR-row slivers, k-major inside a sliver;
// whole slivers in W x W register transposes (vg_pack_t).
template <int MR, int W>
static inline void vg_pack_a(const float* __restrict A, long lda, long mc, long kc, float* __restrict ap) {
  for (long ir = 0; ir < mc; ir += MR, ap += MR * kc) {
    const long mr = vg_min(MR, mc - ir);
    if (mr == MR) {
      vg_pack_t<MR, W>(A + ir * lda, lda, kc, ap);
      continue;
    }
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
    // Rows ldb apart (4 KB at 1024 columns) defeat the hardware prefetcher: ask 8 rows ahead.
    __builtin_prefetch(src + 8 * ldb, 0, 0);
    __builtin_prefetch(src + 8 * ldb + NR - 1, 0, 0);
    if (nr == NR) {
      // Whole vectors, unrolled: as a loop g++ made this a memmove call per row (13% of a
      // weight-gradient GEMM whose B has 1024 columns).
#pragma GCC unroll 16
      for (int q = 0; q < NR; q += 4) vs_storeu(dst + q, vs_loadu<vs_f32x4>(src + q));
    } else {
      for (long q = 0; q < nr; ++q) dst[q] = src[q];
      for (long q = nr; q < NR; ++q) dst[q] = 0.0f;
    }
  }
}

// Slivers [sa, sb) of a row-major B panel (B at its row pc, column jc; n columns from jc), sliver s
// at bp + s * sstride: one row at a time across all of them, so B is read as whole contiguous rows
// (sliver by sliver, each row gave one 64-byte read 4 KB from the last: latency-bound, the
// hardware prefetcher does not follow that stride).
template <int NR>
static inline void vg_pack_b_rows_span(const float* __restrict B, long ldb, long kc, long n, long sa, long sb,
                                       long sstride, float* __restrict bp) {
  for (long k = 0; k < kc; ++k) {
    const float* __restrict src = B + k * ldb;
    for (long s = sa; s < sb; ++s) {
      float* __restrict dst = bp + s * sstride + k * NR;
      const float* __restrict from = src + s * NR;
      const long nr = vg_min(NR, n - s * NR);
      if (nr == NR) {
#pragma GCC unroll 16
        for (int q = 0; q < NR; q += 4) vs_storeu(dst + q, vs_loadu<vs_f32x4>(from + q));
      } else {
        for (long q = 0; q < nr; ++q) dst[q] = from[q];
        for (long q = nr; q < NR; ++q) dst[q] = 0.0f;
      }
    }
  }
}

// One NR-column sliver of a transposed B (B[j * ldb + k], nn.Linear's weight) -> same layout.
template <int NR, int W>
static inline void vg_pack_b_cols(const float* __restrict B, long ldb, long kc, long nr, float* __restrict bp) {
  if (nr == NR) {
    vg_pack_t<NR, W>(B, ldb, kc, bp);
    return;
  }
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
)
