"""Lookup-table kernels (`Walk.LOOKUP_TABLE`; `schedule/table.py` decides which): a pointwise
function of one byte has 256 possible results, so the kernel's own scalar statements fill a
table once and each element is one lookup.

The table lives in a function-local static initialised by a lambda: filled on the kernel's
first call (C++11 makes that thread-safe) and kept, since it depends only on constants baked
into this code. It is filled by rendering the kernel's statements with the load replaced by
the byte value, so every entry is what the plain loop computes for that byte (bit-identical).
The loop: the kernel's usual nest with the load kept (its index map too: broadcasts and
permutes) and each stored value looked up; where the schedule found input and outputs
contiguous (`Kernel.table_flat`) it is `vf_table_bytes` / `vf_table_dwords` instead,
four-register `vpermi2b` shuffles on AVX-512 VBMI.
"""

from __future__ import annotations

from vfuse.codegen.cpp.faults import FAULT_VAR, NO_FAULT
from vfuse.codegen.cpp.function import kernel_function
from vfuse.codegen.cpp.rows import render_single_row
from vfuse.codegen.cpp.rules import COMPUTE_TYPE, STORAGE_TYPE
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir import DType
from vfuse.schedule.kernel import Kernel, Load, Program, Stmt, Store

# 64 registers' worth per step: the shuffle reads its 4 table registers once per 64 bytes.
TABLE_HELPER = """#ifndef VF_TABLE_BYTES
#define VF_TABLE_BYTES
#include <immintrin.h>
// Non-temporal when the schedule streams the kernel (nest.with_streaming) and `p` is aligned.
static inline void vf_tstore(void* p, __m512i v, bool nt) {
  if (nt) _mm512_stream_si512((__m512i*)p, v);
  else _mm512_storeu_si512(p, v);
}
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
#endif
  for (; i < n; ++i) out[i] = t[in[i]];
}
// out[i] = entry in[i] of a table of 4-byte entries split into 4 byte planes (pl[k * 256 + j]:
// byte k of entry j): four byte shuffles, then unpacks interleave the planes into dwords.
static inline void vf_table_dwords(const uint8_t* pl, const uint8_t* __restrict in, uint32_t* __restrict out,
                                   int64_t n, bool nt) {
  int64_t i = 0;
  nt = nt && (uintptr_t)out % 64 == 0;
#if defined(__AVX512VBMI__)
  // Unpacks work inside 128-bit lanes: byte 16L + 4r + m must hold element 16r + 4L + m.
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
#endif
  for (; i < n; ++i) {
    const uint8_t j = in[i];
    out[i] = (uint32_t)pl[j] | (uint32_t)pl[256 + j] << 8 | (uint32_t)pl[512 + j] << 16 | (uint32_t)pl[768 + j] << 24;
  }
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

    def stmt(self, s: Stmt | Store) -> None:
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
        self.w("// A pointwise function of one byte has 256 possible results: tabulated once.")
        self.w("struct vf_tbl {")
        for v, dt in self.tables.items():
            # g++ vectorizes lookups only as 4-byte gathers: narrower entries are widened,
            # except for the byte-shuffle loop, which reads bytes.
            et = "int32_t" if dt in NARROW and not self.k.table_flat else COMPUTE_TYPE[dt]
            self.w(f"  alignas(64) {et} t_{v}[256];")
            if self.planes(dt):
                self.w(f"  alignas(64) uint8_t pl_{v}[1024];")
        self.w("};")
        self.w("static const vf_tbl vf_tb = [] {")
        self.w("  vf_tbl r;")
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
        self.w("  return r;")
        self.w("}();")

    def planes(self, dt: DType) -> bool:
        """Whether a table is also kept as byte planes (4-byte entries, byte-shuffle loop)."""
        return COMPUTE_TYPE[dt] in ("float", "int32_t") and self.k.table_flat

    def bytes_loop(self) -> None:
        (p,) = self.k.passes
        (load,) = [s for s in self.stmts if isinstance(s, Load)]
        n = self.k.inner[0].size
        nt = "true" if self.k.stream else "false"
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
                    self.w(f"  vf_table_dwords(vf_tb.pl_{s.arg}, {src}, {dst}, ve - vb, {nt});")
        if self.k.stream:
            self.w("  vf_stream_fence();  // each thread's streamed stores land before the loop's barrier")
        self.w("}")


def render_table(k: Kernel, program: Program) -> str:
    w = TableWriter(k, program)
    if k.table_flat:
        return TABLE_HELPER + "\n\n" + kernel_function(w, lambda _: w.bytes_loop())
    return kernel_function(w, render_single_row)
