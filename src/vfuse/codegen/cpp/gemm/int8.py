"""render_int8_gemm: C = epilogue(dequant(X) @ dequant(W)^T) as an exact int32 dot product.

X is M x K int8 (A = (X - x_zero) * x_scale), W is N x K int8, nn.Linear's layout
(B^T = (W - w_zero) * w_scale[j]). The schedule decided it (`schedule/int8dot.py`,
`ContractionKernel.int8`); the instruction comes from `DOT_OPS`, one entry per dot-product kind:

    sum_k (X - x_zero)(W - w_zero)
      = dot(A', W) - w_zero * rowsum(A') - (off + x_zero) * colsum(W) + K * (off + x_zero) * w_zero

with A' = X + off, the operand the instruction takes (`vpdpbusd` multiplies unsigned bytes by
signed ones: off = 128). Both operands are packed once per call into the micro-kernel's layout
(groups of 4 consecutive k per 32-bit lane; K, M and N zero-padded, so padding adds 0), with
A's row sums and W's column sums. The micro-kernel keeps an MR x NR int32 tile in registers
over the whole K (exact: |dot| <= 255 * 128 * K < 2^31 for K <= 2^16, `MAX_K`), then each
element is corrected in int64, scaled once in double, and the group's epilogue statements run
on `float v` as in the fp32 template (names i, j, o = i * N + j).
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.codegen.cpp.gemm.prepack import HEADER, PREPACK_ONCE
from vfuse.schedule.kernel import DotKind


@dataclass(frozen=True)
class DotOps:
    """One int8 dot-product instruction as C++ (format fields: {0}, {1}, ...)."""

    header: str  # the intrinsics header
    vec: str  # the int32 vector type
    lanes: int  # int32 lanes per vector
    offset: int  # added to X when packing A (an unsigned operand: 128)
    zero: str
    load: str  # {0}: byte pointer
    splat: str  # A's vector for `rows` rows from byte pointer {0}: 4 bytes per row
    dot: str  # statement: acc {0} += 4-byte dot products of {1} (A; row {3} of its rows) and {2} (B)
    store: str  # {0}: int32 pointer, {1}: vector
    target: str = ""  # enables the instruction for the micro-kernel where the build's -march may not
    rows: int = 1  # rows of A per vector: 1 broadcast, or 4 rows' bytes read by lane


DOT_OPS = {
    DotKind.VNNI: DotOps(
        "immintrin.h",
        "__m512i",
        16,
        128,
        "_mm512_setzero_si512()",
        "_mm512_loadu_si512((const void*)({0}))",
        "_mm512_set1_epi32(vf_ld32({0}))",
        # Inline asm: with the intrinsic g++ 12 stored every accumulator to the stack after its
        # update (the accumulator operand is tied), 2x slower.
        'asm("vpdpbusd %2, %1, %0" : "+v"({0}) : "v"({1}), "v"({2}))',
        "_mm512_storeu_si512((void*)({0}), {1})",
    ),
    # Signed x signed: A is packed as it is (offset 0). Enabled per function: the NEON tier's build
    # is -march=native, but a baseline armv8-a build (the ARM64 tests) has no dotprod.
    DotKind.SDOT: DotOps(
        "arm_neon.h",
        "int32x4_t",
        4,
        0,
        "vdupq_n_s32(0)",
        "vreinterpretq_s32_s8(vld1q_s8((const int8_t*)({0})))",
        "vreinterpretq_s32_u8(vld1q_u8({0}))",
        # By lane: 4 rows of A per register. Broadcasting each row took 8 registers for the 8 rows
        # g++ loaded ahead, and 3 accumulators spilled (the intrinsic's too).
        'asm("sdot %0.4s, %1.16b, %2.4b[{3}]" : "+w"({0}) : "w"({2}), "w"({1}))',
        "vst1q_s32({0}, {1})",
        '__attribute__((target("arch=armv8.2-a+dotprod"))) ',
        4,
    ),
}


@dataclass(frozen=True)
class Int8Spec:
    """Sizes, the operands' C names (among the epilogue's args) and their quantization."""

    name: str
    m: int
    n: int
    k: int
    x: str
    w: str
    x_zero: int
    x_scale: float
    w_zero: int
    w_scale: float
    w_scales: str  # C name of the per-channel scales, or ""
    kind: DotKind
    mr: int
    nr: int
    mcb: int = 1  # MR-row slivers per work item: the schedule's (`Int8Dot.mcb`)
    # W constant (a frozen weight): its packed slivers and column sums are made on the first call
    # into the caller's `char* vg_pre` (prepack.py's slot: header, `w_bytes`, then NB x NR sums).
    prepack: bool = False

    @property
    def w_bytes(self) -> int:
        """Packed W: NB slivers of ceil(K / 4) groups of NR x 4 bytes, rounded up to 64."""
        return (-(-self.n // self.nr) * ((self.k + 3) // 4) * self.nr * 4 + 63) // 64 * 64


def render_int8_gemm(spec: Int8Spec, epilogue: Epilogue) -> str:
    """`static void NAME(OUT* C, <epilogue args>, int nthreads)`."""
    ops = DOT_OPS[spec.kind]
    once = PREPACK_ONCE if spec.prepack else ""
    return render_prelude() + once + _micro(spec, ops) + _driver(spec, ops, epilogue)


def _micro(s: Int8Spec, ops: DotOps) -> str:
    """The register tile, unrolled in the source: g++ keeps an array of vectors in memory."""
    nv, kg = s.nr // ops.lanes, (s.k + 3) // 4
    acc = [[f"c{r}_{v}" for v in range(nv)] for r in range(s.mr)]
    decl = "".join(f"  {ops.vec} {a} = {ops.zero};\n" for row in acc for a in row)
    loads = "".join(f"    const {ops.vec} b{v} = {ops.load.format(f'b + {v * ops.lanes * 4}')};\n" for v in range(nv))
    steps = ""
    for r in range(s.mr):
        if r % ops.rows == 0:
            steps += f"    av = {ops.splat.format(f'a + {r * 4}')};\n"
        lane = r % ops.rows
        steps += "".join(f"    {ops.dot.format(acc[r][v], 'av', f'b{v}', lane)};\n" for v in range(nv))
    stores = "".join(
        f"  {ops.store.format(f'tile + {r * s.nr + v * ops.lanes}', acc[r][v])};\n"
        for r in range(s.mr)
        for v in range(nv)
    )
    return f"""#include <{ops.header}>
#include <vector>
#ifndef VF_LD32
#define VF_LD32
static inline int32_t vf_ld32(const uint8_t* p) {{
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}}
#endif
// vfuse int8 gemm {s.name}: {s.m}x{s.k} @ ({s.n}x{s.k})^T int8, {s.mr}x{s.nr} int32 tile
// Not inlined: in the driver, the epilogue's hoisted constants took registers and tile rows spilled.
{ops.target}__attribute__((noinline)) static void {s.name}_micro(const uint8_t* __restrict a,
    const int8_t* __restrict b, int32_t* __restrict tile) {{
{decl}  {ops.vec} av;
  for (long g = 0; g < {kg}; ++g, a += {s.mr * 4}, b += {s.nr * 4}) {{
{loads}{steps}  }}
{stores}}}
"""


def _pack(s: Int8Spec, ops: DotOps) -> str:
    """Pack W (with column sums) and A = X + offset (with row sums): 4 consecutive k per 32-bit
    lane, rows / columns past the matrix and k past K zero."""
    kg, k = (s.k + 3) // 4, s.k
    flip = "^ 0x80808080u" if ops.offset == 128 else ""
    a_type = "uint8_t" if ops.offset else "int8_t"  # what the row sums add up
    # Prepacked: only the first call packs W (`pack_w` is the same on every thread).
    open_w, close_w = ("  if (pack_w) {\n", "  }\n") if s.prepack else ("", "")
    return f"""{open_w}  #pragma omp for schedule(static) nowait
  for (long jb = 0; jb < NB; ++jb)
    for (long c = 0; c < {s.nr}; ++c) {{
      const long j = jb * {s.nr} + c;
      {_sliver("bp + jb * " + str(kg * s.nr * 4), f"{s.w} + j * {k}", "j", s.n, s.nr, k, "", "colsum[j]", "int8_t")}
    }}
{close_w}  #pragma omp for schedule(static)
  for (long ib = 0; ib < MB; ++ib)
    for (long r = 0; r < {s.mr}; ++r) {{
      const long i = ib * {s.mr} + r;
      {_sliver("ap + ib * " + str(kg * s.mr * 4), f"{s.x} + i * {k}", "i", s.m, s.mr, k, flip, "rowsum[i]", a_type)}
    }}
"""


def _sliver(dst: str, src: str, at: str, size: int, width: int, k: int, flip: str, sum_: str, et: str) -> str:
    """One row of X or W (`src`, K bytes) into entry `at % width` of its packed sliver, and its
    sum (of the packed values)."""
    full, tail = k // 4, k % 4
    entry = f"{at} % {width} * 4"
    x80 = " ^ 0x80" if flip else ""
    at_tail = f"d[{full * width * 4} + t]"
    last = f"for (long t = 0; t < 4; ++t) {at_tail} = t < {tail} ? ({et})(q[{full * 4} + t]{x80}) : ({et})0;"
    last = last if tail else ""
    return f"""{et}* __restrict d = (({et}*)({dst})) + {entry};
      if ({at} >= {size}) {{
        for (long g = 0; g < {(k + 3) // 4}; ++g) std::memset(d + g * {width * 4}, 0, 4);
        {sum_} = 0;
        continue;
      }}
      const {et}* __restrict q = (const {et}*)({src});
      int32_t sum = 0;
      for (long g = 0; g < {full}; ++g) {{
        uint32_t u;
        std::memcpy(&u, q + 4 * g, 4);
        u = u {flip or "^ 0u"};
        std::memcpy(d + g * {width * 4}, &u, 4);
      }}
      for (long kk = 0; kk < {k}; ++kk) sum += ({et})(q[kk]{x80});
      {last}
      {sum_} = sum;"""


def _finish(s: Int8Spec, ops: DotOps, epilogue: Epilogue) -> str:
    """The corrected, scaled value of one tile row's elements, then the epilogue and the store."""
    az = ops.offset + s.x_zero
    corr = f" - {az}LL * (int64_t)colsum[j]"
    if s.w_zero:
        corr += f" - {s.w_zero}LL * (int64_t)rowsum[i] + {s.k * az * s.w_zero}LL"
    scale = f"{s.x_scale * s.w_scale!r}"
    if s.w_scales:
        scale += f" * (double){s.w_scales}[j]"
    body = "".join(f"        {line}\n" for line in epilogue.body)
    return f"""      for (long r = 0; r < {s.mr} && ib * {s.mr} + r < {s.m}; ++r) {{
        const long i = ib * {s.mr} + r;
#pragma omp simd
        for (long c = 0; c < {s.nr}; ++c) {{
          const long j = jb * {s.nr} + c;
          if (j < {s.n}) {{
            [[maybe_unused]] const long o = i * {s.n} + j;
            [[maybe_unused]] const long b = 0;
            const int64_t t = (int64_t)tile[r * {s.nr} + c]{corr};
            float v = (float)((double)t * ({scale}));
{body}            C[o] = {epilogue.store};
          }}
        }}
      }}
"""


def _driver(s: Int8Spec, ops: DotOps, epilogue: Epilogue) -> str:
    kg = (s.k + 3) // 4
    mb, nb = -(-s.m // s.mr), -(-s.n // s.nr)
    mcb = s.mcb
    ncb = 4
    pre, w = ", char* __restrict vg_pre" if s.prepack else "", _w_buffers(s, kg)
    return f"""static void {s.name}({epilogue.out_ctype}* __restrict C{epilogue.params()}{pre}, int nthreads) {{
  constexpr long MB = {mb}, NB = {nb};
  static thread_local std::vector<uint8_t> abuf;
  static thread_local std::vector<int32_t> sums;
  if (abuf.size() < (size_t)(MB * {kg * s.mr * 4})) abuf.resize(MB * {kg * s.mr * 4});
  if (sums.size() < (size_t)(MB * {s.mr} + NB * {s.nr})) sums.resize(MB * {s.mr} + NB * {s.nr});
  uint8_t* const ap = abuf.data();
  int32_t* const rowsum = sums.data();
{w}  const int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
  #pragma omp parallel num_threads(nt)
  {{
{_pack(s, ops)}  #pragma omp for collapse(2) schedule(dynamic, 1)
  for (long jc = 0; jc < NB; jc += {ncb})
    for (long ic = 0; ic < MB; ic += {mcb}) {{
      alignas(64) int32_t tile[{s.mr * s.nr}];
      for (long jb = jc; jb < jc + {ncb} && jb < NB; ++jb)
        for (long ib = ic; ib < ic + {mcb} && ib < MB; ++ib) {{
          {s.name}_micro(ap + ib * {kg * s.mr * 4}, bp + jb * {kg * s.nr * 4}, tile);
{_finish(s, ops, epilogue)}        }}
    }}
  }}
{"  if (pack_w) vg_prepack_done(reinterpret_cast<int*>(vg_pre));" if s.prepack else ""}
}}
"""


def _w_buffers(s: Int8Spec, kg: int) -> str:
    """Packed W and its column sums: per call in thread-local storage, or prepacked in the
    caller's slot, packed (`pack_w`) only by the first caller (the others wait for it)."""
    if s.prepack:
        return f"""  int8_t* const bp = reinterpret_cast<int8_t*>(vg_pre + {HEADER});
  int32_t* const colsum = reinterpret_cast<int32_t*>(vg_pre + {HEADER + s.w_bytes});
  const bool pack_w = vg_prepack_claim(reinterpret_cast<int*>(vg_pre));
"""
    return f"""  static thread_local std::vector<int8_t> bbuf;
  if (bbuf.size() < (size_t)(NB * {kg * s.nr * 4})) bbuf.resize(NB * {kg * s.nr * 4});
  int8_t* const bp = bbuf.data();
  int32_t* const colsum = rowsum + MB * {s.mr};
"""
