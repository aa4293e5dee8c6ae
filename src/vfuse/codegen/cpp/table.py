"""Lookup-table kernels (`Walk.LOOKUP_TABLE`; `schedule/table.py` decides which): a pointwise
function of one byte has 256 possible results, so the kernel's own scalar statements fill a
table once and each element is one lookup.

The table lives in a function-local static initialised by a lambda: filled on the kernel's
first call (C++11 makes that thread-safe) and kept, since it depends only on constants baked
into this code. A table whose entries read scalars at run time (`schedule/table.py`: a scale
that is a graph input) is a `thread_local` one instead, refilled on a call whose scalars differ
bitwise from those of its last fill (kept per thread: two graphs may share the library).
It is filled by rendering the kernel's statements with the load replaced by the byte value, so
every entry is what the plain loop computes for that byte (bit-identical).
The loop: the kernel's usual nest with the load kept (its index map too: broadcasts and
permutes) and each stored value looked up; where the schedule found input and outputs
contiguous (`Kernel.table_flat`) it is `vf_table_bytes` / `vf_table_dwords` instead: byte
shuffles on every tier (`TABLE_HELPER`), the scalar loop on the generic one.
"""

from __future__ import annotations

from vfuse.codegen.cpp.faults import FAULT_VAR, NO_FAULT
from vfuse.codegen.cpp.function import kernel_function
from vfuse.codegen.cpp.rows import render_single_row
from vfuse.codegen.cpp.rules import COMPUTE_TYPE, STORAGE_TYPE
from vfuse.codegen.cpp.streaming import serial_copy
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir import DType
from vfuse.schedule.kernel import Kernel, Load, Program, Stmt, Store

# One lookup per tier (what vector extensions cannot say: a byte shuffle), each with the scalar loop
# as its tail and as the generic tier: AVX-512 VBMI vpermi2b over the 4 table registers per 64 bytes;
# AVX2 vpshufb on nibbles (16 rows of 16 entries, 2 chains sharing their indices) and scalar dword loads;
# NEON tbl over 4 registers (64 entries) and st4 to interleave 4 byte planes into dwords.
TABLE_HELPER = """#ifndef VF_TABLE_BYTES
#define VF_TABLE_BYTES
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif
#if defined(__AVX512F__)
// Non-temporal when the schedule streams the kernel (nest.with_streaming) and `p` is aligned.
static inline void vf_tstore(void* p, __m512i v, bool nt) {
  if (nt) _mm512_stream_si512((__m512i*)p, v);
  else _mm512_storeu_si512(p, v);
}
#endif
#if defined(__AVX2__)
static inline void vf_tstore32(void* p, __m256i v, bool nt) {
  if (nt) _mm256_stream_si256((__m256i*)p, v);
  else _mm256_storeu_si256((__m256i*)p, v);
}
// An empty asm that may change `v`: g++ would otherwise reassociate the XOR chains into trees of
// shuffles computed ahead, which need more than the 16 registers (spills: 1.4x slower in L1).
#define VF_TKEEP(v) __asm__("" : "+x"(v))
// Rows of 16 entries, looked up by vpshufb, which gives 0 where the index has bit 7 set. Index
// j_h = x - 16h (h = 0..8) has it clear exactly when x's row r is in h..h+7 (mod 16). For x < 128
// (r <= 7) that is h <= r: the low chain XORs deltas D[h] = row h ^ row h-1 (row 0 whole) over
// j_0..j_7. For x >= 128 it is h > r - 8 (and always for h = 8): the high chain XORs D[7+h] =
// row 7+h ^ row 8+h (row 15 whole at h = 8) over j_1..j_8. The chains share the indices; each
// holds garbage where x's bit 7 picks the other, which the final blend drops. Per 32 bytes: 16
// shuffles, 8 subtractions, 14 XORs, a blend (45 with a chain of indices each).
static inline void vf_table_rows(const uint8_t* t, __m256i* rows) {
  alignas(16) uint8_t d[16][16];
  for (int l = 0; l < 16; ++l) {
    d[0][l] = t[l];
    d[15][l] = t[240 + l];
    for (int h = 1; h < 8; ++h) {
      d[h][l] = (uint8_t)(t[16 * h + l] ^ t[16 * h + l - 16]);
      d[7 + h][l] = (uint8_t)(t[16 * (7 + h) + l] ^ t[16 * (8 + h) + l]);
    }
  }
  for (int h = 0; h < 16; ++h) rows[h] = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)d[h]));
}
// U vectors of 32 bytes at once: each row loaded once for all of them (16 rows do not fit in registers).
template <int U>
static inline void vf_table_step(const __m256i* rows, const uint8_t* in, uint8_t* out, bool nt) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256i j[U], a[U], b[U];
  for (int u = 0; u < U; ++u) {
    j[u] = _mm256_loadu_si256((const __m256i*)(in + 32 * u));
    a[u] = _mm256_shuffle_epi8(rows[0], j[u]);
    j[u] = _mm256_sub_epi8(j[u], sixteen);
    b[u] = _mm256_shuffle_epi8(rows[8], j[u]);
    a[u] = _mm256_xor_si256(a[u], _mm256_shuffle_epi8(rows[1], j[u]));
    VF_TKEEP(a[u]);
    VF_TKEEP(b[u]);
  }
  for (int h = 2; h < 8; ++h)
    for (int u = 0; u < U; ++u) {
      j[u] = _mm256_sub_epi8(j[u], sixteen);
      a[u] = _mm256_xor_si256(a[u], _mm256_shuffle_epi8(rows[h], j[u]));
      b[u] = _mm256_xor_si256(b[u], _mm256_shuffle_epi8(rows[7 + h], j[u]));
      VF_TKEEP(a[u]);
      VF_TKEEP(b[u]);
      VF_TKEEP(j[u]);
    }
  for (int u = 0; u < U; ++u) {
    j[u] = _mm256_sub_epi8(j[u], sixteen);
    b[u] = _mm256_xor_si256(b[u], _mm256_shuffle_epi8(rows[15], j[u]));
    const __m256i x = _mm256_loadu_si256((const __m256i*)(in + 32 * u));  // reloaded: one register less
    vf_tstore32(out + 32 * u, _mm256_blendv_epi8(a[u], b[u], x), nt);
  }
}
#endif
// out[i] = t[in[i]] for a 256-byte table t.
static inline void vf_table_bytes(const uint8_t* t, const uint8_t* __restrict in, uint8_t* __restrict out, int64_t n,
                                  bool nt) {
  int64_t i = 0;
  nt = nt && (uintptr_t)out % 64 == 0;
#if defined(__AVX512VBMI__)
  const __m512i t0 = _mm512_loadu_si512(t), t1 = _mm512_loadu_si512(t + 64);
  const __m512i t2 = _mm512_loadu_si512(t + 128), t3 = _mm512_loadu_si512(t + 192);
  for (; i + 64 <= n; i += 64) {
    const __m512i x = _mm512_loadu_si512(in + i);
    // Bits 0-6 pick one of 128 bytes from each half of the table; bit 7 picks the half.
    const __m512i lo = _mm512_permutex2var_epi8(t0, x, t1);
    const __m512i hi = _mm512_permutex2var_epi8(t2, x, t3);
    vf_tstore(out + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi), nt);
  }
#elif defined(__AVX2__)
  alignas(32) __m256i rows[16];
  vf_table_rows(t, rows);
  for (; i + 64 <= n; i += 64) {
    // The arithmetic takes most of the time of copying the bytes from memory (Zen 3, one thread:
    // 3.6 ns per 32 bytes in L1, 45 operations took 5.3): the loads are asked for 1 KiB ahead.
    __builtin_prefetch(in + i + 1024, 0, 3);
    vf_table_step<2>(rows, in + i, out + i, nt);
  }
  for (; i + 32 <= n; i += 32) vf_table_step<1>(rows, in + i, out + i, nt);
#elif defined(__aarch64__)
  // tbl over 4 registers is a 64-entry lookup that gives 0 out of range: one per quarter of the
  // table, the index moved down by 64 for each, OR-ed.
  const uint8x16x4_t q0 = vld1q_u8_x4(t), q1 = vld1q_u8_x4(t + 64);
  const uint8x16x4_t q2 = vld1q_u8_x4(t + 128), q3 = vld1q_u8_x4(t + 192);
  const uint8x16_t step = vdupq_n_u8(64);
  for (; i + 16 <= n; i += 16) {
    const uint8x16_t x0 = vld1q_u8(in + i), x1 = vsubq_u8(x0, step);
    const uint8x16_t x2 = vsubq_u8(x1, step), x3 = vsubq_u8(x2, step);
    const uint8x16_t lo = vorrq_u8(vqtbl4q_u8(q0, x0), vqtbl4q_u8(q1, x1));
    vst1q_u8(out + i, vorrq_u8(lo, vorrq_u8(vqtbl4q_u8(q2, x2), vqtbl4q_u8(q3, x3))));
  }
#endif
  for (; i < n; ++i) out[i] = t[in[i]];
}
// out[i] = entry in[i] of a table of 4-byte entries t32, also split into 4 byte planes (pl[k * 256 + j]:
// byte k of entry j) for the tiers that shuffle bytes.
static inline void vf_table_dwords(const uint32_t* t32, const uint8_t* pl, const uint8_t* __restrict in,
                                   uint32_t* __restrict out, int64_t n, bool nt) {
  int64_t i = 0;
  nt = nt && (uintptr_t)out % 64 == 0;
  (void)pl;
#if defined(__AVX512VBMI__)
  // Four byte shuffles, then unpacks interleave the planes into dwords. Unpacks work inside
  // 128-bit lanes: byte 16L + 4r + m must hold element 16r + 4L + m.
  alignas(64) uint8_t order[64];
  for (int p = 0; p < 64; ++p) order[p] = (uint8_t)(16 * ((p % 16) / 4) + 4 * (p / 16) + p % 4);
  const __m512i ord = _mm512_load_si512(order);
  for (; i + 64 <= n; i += 64) {
    const __m512i x = _mm512_permutexvar_epi8(ord, _mm512_loadu_si512(in + i));
    const __mmask64 m = _mm512_movepi8_mask(x);
    __m512i b[4];
    for (int k = 0; k < 4; ++k) {
      const uint8_t* t = pl + 256 * k;
      const __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(t), x, _mm512_loadu_si512(t + 64));
      const __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512(t + 128), x, _mm512_loadu_si512(t + 192));
      b[k] = _mm512_mask_blend_epi8(m, lo, hi);
    }
    const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), lo23 = _mm512_unpacklo_epi8(b[2], b[3]);
    const __m512i hi01 = _mm512_unpackhi_epi8(b[0], b[1]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
    vf_tstore(out + i, _mm512_unpacklo_epi16(lo01, lo23), nt);
    vf_tstore(out + i + 16, _mm512_unpackhi_epi16(lo01, lo23), nt);
    vf_tstore(out + i + 32, _mm512_unpacklo_epi16(hi01, hi23), nt);
    vf_tstore(out + i + 48, _mm512_unpackhi_epi16(hi01, hi23), nt);
  }
#elif defined(__AVX2__)
  // 8 scalar loads inserted into a vector, one store: a dword gather per 8 entries took 14 ns per 32
  // in L1 on Zen 3, these 8 (16 byte shuffles per plane would cost more than either).
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    __builtin_memcpy(&v, in + i, 8);
    const int* e = (const int*)t32;
    vf_tstore32(out + i,
                _mm256_setr_epi32(e[v & 255], e[(v >> 8) & 255], e[(v >> 16) & 255], e[(v >> 24) & 255],
                                  e[(v >> 32) & 255], e[(v >> 40) & 255], e[(v >> 48) & 255], e[v >> 56]),
                nt);
  }
#elif defined(__aarch64__)
  uint8_t b[4][16];
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 4; ++k) vf_table_bytes(pl + 256 * k, in + i, b[k], 16, false);
    const uint8x16x4_t planes = {{vld1q_u8(b[0]), vld1q_u8(b[1]), vld1q_u8(b[2]), vld1q_u8(b[3])}};
    vst4q_u8((uint8_t*)(out + i), planes);  // st4 interleaves: byte k of entry j from plane k
  }
#endif
  for (; i < n; ++i) out[i] = t32[in[i]];
}
#endif"""

# Compute types narrower than a 4-byte gather.
NARROW = (DType.I8, DType.U8, DType.BOOL, DType.I16)
BYTES_BLOCK = 1 << 16  # elements per parallel block of the byte-shuffle loop


def table_vars(k: Kernel) -> list[str]:
    """The stored vars, one table each (in store order, without repeats)."""
    stores = [s for p in k.passes for s in p.body if isinstance(s, Store)]
    return list(dict.fromkeys(s.arg for s in stores))


class TableWriter(KernelWriter):
    """Renders the kernel's statements in two modes: `filling` (inside the table's lambda, the
    load replaced by the byte `b`) and the loop (the load, then one lookup per stored value)."""

    def __init__(self, kernel: Kernel, program: Program) -> None:
        super().__init__(kernel, program)
        self.filling = False
        self.stmts = [s for p in kernel.passes for s in (*p.before, *p.body) if not isinstance(s, Store)]
        tables = table_vars(kernel)
        self.tables = {s.var: s.dtype for s in self.stmts if s.var in tables}  # type: ignore[union-attr]
        # Run-time scalars the entries read: loaded once, before the table.
        self.scalars = [s for s in self.stmts if isinstance(s, Load) and s.var != kernel.table]

    def stmt(self, s: Stmt | Store) -> None:
        if isinstance(s, Load) and s in self.scalars:
            return  # loaded before the table (`fill`)
        if isinstance(s, Store) or (isinstance(s, Load) and not self.filling):
            super().stmt(s)
        elif isinstance(s, Load):
            self.dtypes[s.var] = s.dtype
            self.w(f"const {COMPUTE_TYPE[s.dtype]} {s.var} = ({STORAGE_TYPE[s.dtype]})b;")
        elif self.filling:
            super().stmt(s)
        elif s.var in self.tables:
            self.dtypes[s.var] = s.dtype
            ct = COMPUTE_TYPE[s.dtype]
            self.w(f"const {ct} {s.var} = ({ct})vf_tb.t_{s.var}[(uint8_t){self.k.table}];")

    def pointers(self) -> None:
        """The pointers, then the table."""
        super().pointers()
        self.fill()

    def fill(self) -> None:
        when = "for each new value of its run-time scalars" if self.scalars else "once"
        self.w(f"// A pointwise function of one byte has 256 possible results: tabulated {when}.")
        self.w("struct vf_tbl {")
        for v, dt in self.tables.items():
            # g++ vectorizes lookups only as 4-byte gathers: narrower entries are widened,
            # except for the byte-shuffle loop, which reads bytes.
            et = "int32_t" if dt in NARROW and not self.k.table_flat else COMPUTE_TYPE[dt]
            self.w(f"  alignas(64) {et} t_{v}[256];")
            if self.planes(dt):
                self.w(f"  alignas(64) uint8_t pl_{v}[1024];")
        self.w("};")
        if self.scalars:
            self.refilled()
            return
        self.w("static const vf_tbl vf_tb = [] {")
        self.w("  vf_tbl r;")
        self.entries()
        self.w("  return r;")
        self.w("}();")

    def refilled(self) -> None:
        """The table of a kernel whose entries read run-time scalars: per thread, refilled when
        the scalars differ (bitwise: a NaN scale is "the same" as itself) from its last fill's."""
        for s in self.scalars:
            super().stmt(s)
        self.w("static thread_local vf_tbl vf_tc;")
        self.w("static thread_local bool vf_tc_full = false;")
        changed = ["!vf_tc_full"]
        for s in self.scalars:
            ct = COMPUTE_TYPE[self.dtypes[s.var]]
            self.w(f"static thread_local {ct} vf_key_{s.var};")
            changed.append(f"std::memcmp(&vf_key_{s.var}, &{s.var}, sizeof({ct})) != 0")
        self.w(f"if ({' || '.join(changed)}) {{")
        self.w("  vf_tc_full = true;")
        for s in self.scalars:
            self.w(f"  vf_key_{s.var} = {s.var};")
        self.w("  vf_tbl& r = vf_tc;")
        self.entries()
        self.w("}")
        self.w("const vf_tbl& vf_tb = vf_tc;")

    def entries(self) -> None:
        """`r.t_v[b]` for every byte value b, by the kernel's own statements."""
        self.w("  for (int b = 0; b < 256; ++b) {")
        with self.indent(2):
            # The fill runs in a lambda without captures: no fault record, and no divisor can be
            # 0 there (schedule/table.py takes integer division by nonzero constants only).
            self.filling, self.fault = True, NO_FAULT
            for s in self.stmts:
                self.stmt(s)
            self.filling, self.fault = False, FAULT_VAR
            for v, dt in self.tables.items():
                self.w(f"r.t_{v}[b] = {v};")
                if self.planes(dt):
                    self.w(
                        f"for (int k = 0; k < 4; ++k) std::memcpy(&r.pl_{v}[k * 256 + b], (const char*)&{v} + k, 1);"
                    )
        self.w("  }")

    def planes(self, dt: DType) -> bool:
        """Whether a table is also kept as byte planes (4-byte entries, byte-shuffle loop)."""
        return COMPUTE_TYPE[dt] in ("float", "int32_t") and self.k.table_flat

    def bytes_loop(self) -> None:
        (p,) = self.k.passes
        (load,) = [s for s in self.stmts if isinstance(s, Load) and s.var == self.k.table]
        n = self.k.inner[0].size
        nt = "true" if self.k.stream else "false"
        start = self.mark()
        if self.k.threaded:
            self.w("#pragma omp parallel for num_threads(nt) schedule(static)")
        self.w(f"for (int64_t vb = 0; vb < {n}; vb += {BYTES_BLOCK}) {{")
        self.w(f"  const int64_t ve = vb + {BYTES_BLOCK} < {n} ? vb + {BYTES_BLOCK} : {n};")
        src = f"(const uint8_t*){pointer(load.buf)} + vb"
        for s in p.body:
            if isinstance(s, Store):
                dst = f"(uint8_t*){pointer(s.buf)} + vb"
                if s.dtype.itemsize == 1:
                    self.w(f"  vf_table_bytes((const uint8_t*)vf_tb.t_{s.arg}, {src}, {dst}, ve - vb, {nt});")
                else:
                    dst = f"(uint32_t*){pointer(s.buf)} + vb"
                    t32 = f"(const uint32_t*)vf_tb.t_{s.arg}"
                    self.w(f"  vf_table_dwords({t32}, vf_tb.pl_{s.arg}, {src}, {dst}, ve - vb, {nt});")
        if self.k.stream:
            self.w("  vf_stream_fence();  // each thread's streamed stores land before the loop's barrier")
        self.w("}")
        if self.k.threaded:  # threads chosen per call: a serial copy for one thread (`streaming.serial_copy`)
            serial_copy(self, start)


def render_table(k: Kernel, program: Program) -> str:
    w = TableWriter(k, program)
    if k.table_flat:
        return TABLE_HELPER + "\n\n" + kernel_function(w, lambda _: w.bytes_loop())
    return kernel_function(w, render_single_row)
