"""render_conv2d_direct: stride-1 conv2d + epilogue with no im2col ("padded-width" direct conv).

Generated signature (same as render_conv2d):
    <linkage> void <name>(const float* X, const float* Wt, float* Y, <epilogue args>, int nthreads)

Why: for a stride-1 conv, copy each input plane once into a zero-padded scratch Xp with rows of
Wp = W + gap floats (layout in `_Geom`) and compute output "columns" q = oh * Wp + ow over the
padded width. Then the im2col row (ic, kh, kw) at columns [q0, q0 + NR) is the contiguous run
Xp[ic * plane + kh * dh * Wp + kw * dw + q0 ...], so the micro-kernel loads B straight from Xp
at compile-time offsets: no gather and no B packing. Columns with ow >= OW are garbage (they
read across a row end) and are never stored: Wp / OW extra work (57 / 56 for conv_bn_relu).

Per (image, group): C (OCg x OH*Wp) = A (OCg x Cg*KH*KW, the OIHW weight packed per call into
MR-row slivers, k-major) @ B(Xp). Per NR-column sliver: K blocks of `icb` input channels (one
A sliver in half of L1) -> MR-row slivers; the OCg x NR tile lives in a per-thread buffer, and
on the last K block each MR-row block gets the epilogue and is stored (valid runs only) into Y.

Measured against implicit GEMM and oneDNN: docs/perf-log.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfuse.codegen.cpp.gemm.conv_prepack import PREPACK_ONCE, prepack_param, weight_once
from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.microkernel import check_tile, fma_step
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.codegen.cpp.simd import vtype
from vfuse.schedule.blocks import direct_blocks

if TYPE_CHECKING:
    from vfuse.codegen.cpp.gemm.conv import ConvSpec


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class _Geom:
    """Derived sizes of the padded-width formulation (all baked into the C++ as constants).

    Row layout of one padded plane: `pw` zeros, the W inputs, then `gap - pw` more zeros, so a
    read right of a row's end lands in the next row's leading zeros: one shared gap serves as
    the right padding of row h and the left padding of row h + 1, and Wp = W + gap (57 for
    56 + pad 1) wastes 1 garbage column per output row instead of 2.
    """

    def __init__(self, spec: ConvSpec, mr: int, nr: int, icb: int | None, lanes: int = 16) -> None:
        (ph, pw), (dh, dw) = spec.padding, spec.dilation
        self.mr, self.nr, self.lanes = mr, nr, lanes
        self.oh, self.ow = spec.out_hw
        self.cg, self.ocg = spec.c_in // spec.groups, spec.c_out // spec.groups
        self.taps = spec.kh * spec.kw
        self.k = self.cg * self.taps
        # Column phases read by some tap (strided convs: `_phase_geometry`); stride 1: the plane itself.
        self.phases: list[tuple[int, int]] = []
        if spec.stride != (1, 1):
            self._phase_geometry(spec)
        else:
            self.gap = max(pw, 2 * pw - dw * (spec.kw - 1))
            self.hp, self.wp = spec.h + 2 * ph, spec.w + self.gap
            self.plane = self.hp * self.wp + pw  # the last row's right padding
            self.offs = [kh * dh * self.wp + kw * dw for kh in range(spec.kh) for kw in range(spec.kw)]
        # Compact columns (no garbage column computed) where the schedule chose them (ConvSpec.compact).
        self.compact = spec.compact and self.wp > self.ow
        if self.compact and self.ow % lanes:
            raise ValueError(f"{spec.name}: compact columns need whole vectors per row, OW {self.ow} at {lanes} lanes")
        # Output columns per (image, group): p = oh * OW + ow (compact), or padded-width q = oh * Wp + ow.
        self.ncols = self.oh * (self.ow if self.compact else self.wp)
        self.nsl = -(-self.ncols // nr)
        self.mpad = _round_up(self.ocg, mr)
        # Reads past the last plane: the last sliver's tail plus the largest tap offset.
        self.slack = max(0, self.nsl * nr + max(self.offs) - self.plane) + 16
        # Input channels per K block and output channels per M block: the schedule's (ConvSpec.blocks,
        # schedule/blocks.direct_blocks: why); a spec rendered outside a Program gets its rule.
        icb_rule, self.mb = (
            (spec.blocks.icb, spec.blocks.mb)
            if spec.blocks is not None
            else direct_blocks(self.cg, self.ocg, self.taps, mr, spec.caches)
        )
        self.icb = icb or icb_rule

    def _phase_geometry(self, spec: ConvSpec) -> None:
        """A strided conv as a stride-1 one over phase planes: padded row R = r * SH + a and column
        C = q * SW + b live in phase plane (a, b) at (r, q), so tap (kh, kw) reads plane
        (kh*DH % SH, kw*DW % SW) at the stride-1 offset (kh*DH // SH, kw*DW // SW), and each im2col
        row is again a contiguous run the micro-kernel loads in place (no gather, no B packing).
        Only the phases some tap reads are stored (a 1x1 stride-2 conv: one, a quarter of x)."""
        (ph, pw), (dh, dw), (sh, sw) = spec.padding, spec.dilation, spec.stride
        self.gap = 0
        self.hp, self.wp = -(-(spec.h + 2 * ph) // sh), -(-(spec.w + 2 * pw) // sw)
        taps = [(kh * dh, kw * dw) for kh in range(spec.kh) for kw in range(spec.kw)]
        self.phases = sorted({(r % sh, c % sw) for r, c in taps})
        area = self.hp * self.wp
        self.plane = len(self.phases) * area
        at = {p: i * area for i, p in enumerate(self.phases)}
        self.offs = [at[(r % sh, c % sw)] + r // sh * self.wp + c // sw for r, c in taps]


def _ukr(name: str, g: _Geom, rows: int) -> str:
    """NAME_ukr<FIRST>: the `rows` x nr tile (rows = mr, or the tail: OCg % mr, as NAME_ukrt) over `nic`
    input channels, B loaded straight from the padded planes; A slivers keep mr rows per k either way."""
    nv, vt, w = g.nr // g.lanes, vtype(g.lanes), g.lanes
    acc = [(r, v) for r in range(rows) for v in range(nv)]
    init = "".join(
        f"  {vt} c{r}_{v} = FIRST ? {vt}{{}} : *reinterpret_cast<const {vt}*>(t + {r * g.nr + w * v});\n"
        for r, v in acc
    )
    body = ""
    for tap, off in enumerate(g.offs):
        # vs_keep: else g++ folds each B load into its mr FMAs as a memory operand (4x24 on AVX2:
        # 16 loads per 12 FMAs, 2x slower); one load per vector, held in a register.
        at = [f"x{v} + {off}" if g.compact else f"x + {off + w * v}" for v in range(nv)]
        body += "".join(f"    b{v} = vs_loadu<{vt}>({at[v]});\n    vs_keep(b{v});\n" for v in range(nv))
        body += fma_step(rows, nv, w, tap * g.mr)
    stores = "".join(f"  *reinterpret_cast<{vt}*>(t + {r * g.nr + w * v}) = c{r}_{v};\n" for r, v in acc)
    decl = ", ".join(f"b{v}" for v in range(nv))
    # Compact columns: a pointer per vector, stepped per channel. Why not x + vo[v] + offset: g++
    # then hoists each (vector, tap) sum out of the loop, 27 of them at AVX2's 4x24, which spill
    # and are reloaded from the stack every load (measured 6 % slower than the padded width).
    offsets = "".join(f"  const float* __restrict x{v} = x + vo[{v}];\n" for v in range(nv)) if g.compact else ""
    step = "".join(f", x{v} += {g.plane}" for v in range(nv)) if g.compact else f", x += {g.plane}"
    return f"""template <bool FIRST>
static inline void {name}_ukr{"" if rows == g.mr else "t"}(long nic, const float* __restrict a,
                                 const float* __restrict x,{" const long* __restrict vo," if g.compact else ""}
                                 float* __restrict t) {{
{init}{offsets}  [[maybe_unused]] {vt} av;
  {vt} {decl};
  for (long ic = 0; ic < nic; ++ic, a += {g.mr * g.taps}{step}) {{
{body}  }}
{stores}}}
"""


def _ukr_calls(name: str, g: _Geom) -> str:
    """C++: the micro-kernel call for the MR block at `ir`. Why a tail kernel: OCg rounded up to mr
    wastes FMAs on zero rows (AVX2's 6x16 at 64 channels: 3 %); the last block computes OCg % mr rows."""
    args = f"(nic, a, xb,{' rs.vo,' if g.compact else ''} t + ir * {g.nr});"
    full = f"if (ic0 == 0) {name}_ukr<true>{args} else {name}_ukr<false>{args}"
    if not g.ocg % g.mr:
        return full
    tail = f"if (ic0 == 0) {name}_ukrt<true>{args} else {name}_ukrt<false>{args}"
    return f"if (ir + {g.mr} > {g.ocg}) {{ {tail} }} else {{ {full} }}"


def _pack_and_pad(spec: ConvSpec, g: _Geom) -> str:
    """NAME_pack_w (the weight as the A operand) and NAME_pad (one input plane -> padded scratch)."""
    name = spec.name
    pad = _phase_pad(spec, g) if g.phases else _row_pad(spec, g)
    return f"""
// One MR-row sliver `blk` (over all groups) of the OIHW weight -> k-major, zero rows past OCg.
static void {name}_pack_w(const float* __restrict w, float* __restrict ap, long blk) {{
  const long gi = blk / {g.mpad // g.mr}, ir = blk % {g.mpad // g.mr} * {g.mr};
  ap += blk * {g.mr * g.k};
  for (long k = 0; k < {g.k}; ++k, ap += {g.mr})
    for (long r = 0; r < {g.mr}; ++r) ap[r] = ir + r < {g.ocg} ? w[(gi * {g.ocg} + ir + r) * {g.k} + k] : 0.0f;
}}
{pad}"""


def _phase_pad(spec: ConvSpec, g: _Geom) -> str:
    """NAME_pad for a strided conv: rows [r0, r1) of each stored phase plane (`_Geom._phase_geometry`)
    from one input plane. Per phase row a zero run, a strided copy and a zero run of constant bounds.
    Why not vectorized with a column stride: g++ 12 -O3 at x86-64-v3 miscompiled the strided copies
    of short phase rows (stride (1, 2), padding (2, 0), W 7 or 17: a phase's rows all zero; -O2,
    generic and -fno-tree-vectorize builds right), whatever the loops' order; one pass over x."""
    (ph, pw), (sh, sw), body = spec.padding, spec.stride, ""
    for i, (a, b) in enumerate(g.phases):
        # Phase column q holds input column q * SW + b - PW: inside [0, W) for q in [lo, hi).
        lo = min(g.wp, max(0, -(-(pw - b) // sw)))
        hi = max(lo, min(g.wp, -(-(spec.w + pw - b) // sw)))
        body += f"""    {{
      float* __restrict row = xp + {i * g.hp * g.wp} + r * {g.wp};
      const long h = r * {sh} + {a - ph};
      if (h < 0 || h >= {spec.h}) {{
        for (long q = 0; q < {g.wp}; ++q) row[q] = 0.0f;
      }} else {{
        const float* __restrict src = x + h * {spec.w};
        for (long q = 0; q < {lo}; ++q) row[q] = 0.0f;
        for (long q = {lo}; q < {hi}; ++q) row[q] = src[q * {sw} + {b - pw}];
        for (long q = {hi}; q < {g.wp}; ++q) row[q] = 0.0f;
      }}
    }}
"""
    return f"""
// Phase rows [r0, r1) of one input plane, every stored phase (a, b): padded row r * {sh} + a,
// padded columns q * {sw} + b (see _Geom._phase_geometry).
{'__attribute__((optimize("no-tree-vectorize")))' if sw > 1 else ""}
static inline void {spec.name}_pad(const float* __restrict x, float* __restrict xp, long r0, long r1) {{
  for (long r = r0; r < r1; ++r) {{
{body}  }}
}}
"""


def _row_pad(spec: ConvSpec, g: _Geom) -> str:
    """NAME_pad for stride 1: rows [r0, r1) of one input plane into the padded-width plane."""
    (ph, pw), name = spec.padding, spec.name
    return f"""
// Padded rows [r0, r1) of one input plane (each row: pw zeros, the W inputs, gap - pw zeros;
// see _Geom); r1 == Hp also writes the plane's trailing pw zeros.
static inline void {name}_pad(const float* __restrict x, float* __restrict xp, long r0, long r1) {{
  for (long r = r0; r < r1; ++r) {{
    float* __restrict row = xp + r * {g.wp};
    const long h = r - {ph};
    if (h < 0 || h >= {spec.h}) {{
      for (long q = 0; q < {g.wp}; ++q) row[q] = 0.0f;
      continue;
    }}
    // Constant-count loops, not memcpy: rows are short (a call per row cost more than the copy).
    for (long q = 0; q < {pw}; ++q) row[q] = 0.0f;
#pragma omp simd
    for (long q = 0; q < {spec.w}; ++q) row[{pw} + q] = x[h * {spec.w} + q];
    for (long q = {pw + spec.w}; q < {g.wp}; ++q) row[q] = 0.0f;
  }}
  if (r1 == {g.hp})
    for (long q = 0; q < {pw}; ++q) xp[{g.hp * g.wp} + q] = 0.0f;
}}
"""


def _runs(spec: ConvSpec, g: _Geom) -> str:
    """NAME_runs: the sliver's valid (ow < OW) column runs, and for every column a safe output index
    (garbage columns get a clamped one, so an epilogue reading e.g. residual[o] stays in bounds)."""
    runs = g.nr // g.wp + 2
    vo = f"  long vo[{g.nr // g.lanes}];\n" if g.compact else ""
    struct = f"""
struct {spec.name}_Runs {{
  int n;
  long t[{runs}], p[{runs}], len[{runs}];
{vo}  alignas(64) int pidx[{g.nr}];
}};
"""
    return struct + (_compact_runs(spec, g) if g.compact else _padded_runs(spec, g))


def _compact_runs(spec: ConvSpec, g: _Geom) -> str:
    """Compact columns (`_Geom.compact`): one run, and each vector's offset in the padded plane
    (vectors past the last output repeat the last one: computed, never stored)."""
    return f"""
static inline void {spec.name}_runs(long p0, {spec.name}_Runs& rs) {{
  rs.n = 1; rs.t[0] = 0; rs.p[0] = p0; rs.len[0] = vg_min({g.nr}, {g.ncols} - p0);
  for (int v = 0; v < {g.nr // g.lanes}; ++v) {{
    const long p = vg_min(p0 + v * {g.lanes}, {g.ncols - g.lanes});
    rs.vo[v] = p / {g.ow} * {g.wp} + p % {g.ow};
  }}
  for (int e = 0; e < {g.nr}; ++e) rs.pidx[e] = static_cast<int>(vg_min(p0 + e, {g.ncols - 1}));
}}
"""


def _padded_runs(spec: ConvSpec, g: _Geom) -> str:
    return f"""
static inline void {spec.name}_runs(long q0, {spec.name}_Runs& rs) {{
  rs.n = 0;
  for (long col = 0; col < {g.nr};) {{
    const long q = q0 + col, oh = q / {g.wp}, ow = q % {g.wp};
    if (oh >= {g.oh}) break;
    if (ow < {g.ow}) {{
      rs.t[rs.n] = col; rs.p[rs.n] = oh * {g.ow} + ow; rs.len[rs.n] = vg_min({g.ow} - ow, {g.nr} - col); ++rs.n;
    }}
    col += {g.wp} - ow;
  }}
  for (int e = 0; e < {g.nr}; ++e) {{
    const long q = q0 + e, oh = vg_min(q / {g.wp}, {g.oh - 1}), ow = vg_min(q % {g.wp}, {g.ow - 1});
    rs.pidx[e] = static_cast<int>(oh * {g.ow} + ow);
  }}
}}
"""


def _out_base(spec: ConvSpec, g: _Geom) -> str:
    """C++: the offset of entry `bi`'s first output channel plane from Y, in planes."""
    return f"(bi / {spec.groups} * {spec.c_out} + bi % {spec.groups} * {g.ocg})"


def _epilogue(spec: ConvSpec, g: _Geom, epi: Epilogue, to_y: bool = False) -> str:
    """NAME_epi: the epilogue over whole tile rows [i0, i1) in place: a fixed-length loop that
    vectorizes fully, garbage columns included (their clamped indices keep reads in bounds).
    `to_y`: NAME_epi_y, the same into Y, for a sliver whose NR columns are one run (`_sliver`)."""
    name = f"{spec.name}_epi_y" if to_y else f"{spec.name}_epi"
    tile = "const float* __restrict t, float* __restrict Y" if to_y else "float* __restrict t"
    dst = "Y + co + rs.p[0]" if to_y else f"t + i * {g.nr}"
    return f"""
static inline void {name}({tile}, long bi, const {spec.name}_Runs& rs, long i0,
                                   long i1{epi.params()}) {{
  [[maybe_unused]] const long n = bi / {spec.groups};
  for (long i = i0; i < i1; ++i) {{
    [[maybe_unused]] const long c = (bi % {spec.groups}) * {g.ocg} + i, co = ({_out_base(spec, g)} + i) * {g.oh * g.ow};
    const float* __restrict trow = t + i * {g.nr};
    float* __restrict drow = {dst};
#pragma omp simd
    for (int e = 0; e < {g.nr}; ++e) {{
      [[maybe_unused]] const long p = rs.pidx[e], j = p, o = co + p, oh = p / {g.ow}, ow = p % {g.ow};
      float v = trow[e];
{epi.code("      ")}      drow[e] = v;
    }}
  }}
}}
"""


def _copy(spec: ConvSpec, g: _Geom) -> str:
    """NAME_copy: the valid runs of tile rows [i0, i1) into NCHW Y (masked stores, no tails)."""
    return f"""
static inline void {spec.name}_copy(const float* __restrict t, float* __restrict Y, long bi,
                                    const {spec.name}_Runs& rs, long i0, long i1) {{
  for (long i = i0; i < i1; ++i) {{
    const float* __restrict trow = t + i * {g.nr};
    float* __restrict yrow = Y + ({_out_base(spec, g)} + i) * {g.oh * g.ow};
    for (int r = 0; r < rs.n; ++r) {{
      const float* __restrict src = trow + rs.t[r];
      float* __restrict dst = yrow + rs.p[r];
      const long len = rs.len[r];
#if defined(__AVX512F__)
      for (long e = 0; e < len; e += 16) {{
        const __mmask16 m = static_cast<__mmask16>(len - e >= 16 ? 0xffff : (1u << (len - e)) - 1u);
        _mm512_mask_storeu_ps(dst + e, m, _mm512_loadu_ps(src + e));
      }}
#elif defined(__AVX2__)
      // No masked stores (vmaskmovps is slow on AMD: 1.5 % of conv_bn_relu at AVX2, Zen 4): a run's
      // last whole vector ends at its end, overlapping the one before; a short run in two 4-wide
      // stores that overlap, or up to 3 single ones. No memcpy call per run either.
      if (len >= 8) {{
        for (long e = 0; e + 8 < len; e += 8) _mm256_storeu_ps(dst + e, _mm256_loadu_ps(src + e));
        _mm256_storeu_ps(dst + len - 8, _mm256_loadu_ps(src + len - 8));
      }} else if (len >= 4) {{
        _mm_storeu_ps(dst, _mm_loadu_ps(src));
        _mm_storeu_ps(dst + len - 4, _mm_loadu_ps(src + len - 4));
      }} else {{
        dst[0] = src[0];  // runs are never empty
        if (len > 1) dst[1] = src[1];
        if (len > 2) dst[2] = src[2];
      }}
#else
      std::memcpy(dst, src, sizeof(float) * len);
#endif
    }}
  }}
}}
"""


def _sliver(spec: ConvSpec, g: _Geom, epi: Epilogue) -> str:
    """NAME_sliver: one NR-column sliver of one (image, group): K blocks x MR slivers; on the
    last K block each MR-row block gets its epilogue right away and is stored one block later.

    Why so: the copy reads the tile at unaligned run starts, which stall on store forwarding
    right after the epilogue's aligned stores to the same rows; a block later they are long
    done, and the stores to Y (which miss) overlap the next block's FMAs."""
    name, rows = spec.name, f"vg_min(ir + {g.mr}, {g.ocg})"
    base = f"{_out_base(spec, g)} * {g.oh * g.ow}"
    return f"""
static inline void {name}_sliver(const float* __restrict ap, const float* __restrict xp, float* __restrict t,
                                 float* __restrict Y, long bi, long q0, long ir0, long ir1{epi.params()}) {{
  {name}_Runs rs;
  {name}_runs(q0, rs);
  // One run of NR columns (compact columns: all slivers but the last): the epilogue writes Y itself,
  // no second pass over the tile (measured 1 % of conv_bn_relu at AVX2).
  const bool whole = rs.n == 1 && rs.len[0] == {g.nr};
  // Why prefetch: Y is written once, row by row 12 KB apart, so its stores miss; asking for the
  // next sliver's output lines while the FMAs run takes that wait off the critical path.
{_next_output(g)}  char* yn = reinterpret_cast<char*>(Y + {base} + pn);
  for (long ic0 = 0; ic0 < {g.cg}; ic0 += {g.icb}) {{
    const long nic = vg_min({g.icb}, {g.cg} - ic0);
    const bool last = ic0 + nic == {g.cg};
    const float* __restrict xb = xp + ic0 * {g.plane}{"" if g.compact else " + q0"};
    for (long ir = ir0; ir < ir1; ir += {g.mr}) {{
      const float* __restrict a = ap + ir * {g.k} + ic0 * {g.taps * g.mr};
      for (long r = ir; ic0 == 0 && r < {rows}; ++r)
        for (long l = 0; l < {g.nr * 4 + 64}; l += 64) __builtin_prefetch(yn + r * {g.oh * g.ow * 4} + l, 1, 3);
      {_ukr_calls(name, g)}
      if (!last || ir >= {g.ocg}) continue;
      if (whole) {{ {name}_epi_y(t, Y, bi, rs, ir, {rows}{epi.names()}); continue; }}
      {name}_epi(t, bi, rs, ir, {rows}{epi.names()});
      if (ir > ir0) {name}_copy(t, Y, bi, rs, ir - {g.mr}, ir);
    }}
  }}
  const long end = vg_min(ir1, {g.ocg}), lastrow = (end - 1) / {g.mr} * {g.mr};
  if (!whole && end > ir0) {name}_copy(t, Y, bi, rs, lastrow, end);
}}
"""


def _next_output(g: _Geom) -> str:
    """C++: `pn`, the output index of the next sliver's first column (q0: this sliver's first)."""
    if g.compact:
        return f"  const long pn = vg_min(q0 + {g.nr}, {g.ncols - 1});\n"
    return f"""  const long qn = vg_min(q0 + {g.nr}, {g.ncols - 1});
  const long pn = vg_min(qn / {g.wp}, {g.oh - 1}) * {g.ow} + vg_min(qn % {g.wp}, {g.ow - 1});
"""


def _span(spec: ConvSpec, g: _Geom, epi: Epilogue) -> str:
    """NAME_span: slivers [s0, s1) of one (image, group) entry whose padded planes start at xb, one
    M block of output channels (`_Geom.mb`) at a time."""
    return f"""
static void {spec.name}_span(const float* __restrict ap, const float* __restrict xb, float* __restrict Y, long bi,
                             long s0, long s1{epi.params()}) {{
  alignas(64) float t[{g.mpad * g.nr}];
  const float* __restrict ab = ap + (bi % {spec.groups}) * {g.mpad * g.k};
  for (long ir0 = 0; ir0 < {g.mpad}; ir0 += {g.mb})
    for (long s = s0; s < s1; ++s)
      {spec.name}_sliver(ab, xb, t, Y, bi, s * {g.nr}, ir0, vg_min(ir0 + {g.mb}, {g.mpad}){epi.names()});
}}
"""


def _entry(spec: ConvSpec, g: _Geom, epi: Epilogue) -> str:
    batch, hw, entry = spec.n * spec.groups, spec.h * spec.w, g.cg * g.plane
    span, params = f"{spec.name}_span", f"float* __restrict Y{epi.params()}"
    pre = prepack_param(spec.prepack)
    # Dynamic schedules: a thread that loses its core for a while (a busy machine) does not hold
    # the others up at the end. `whole`: whole entries per thread, each padded into the thread's
    # own scratch right before use (still in L2 when the micro-kernel reads it; buffer reused).
    # Measured slower: padding row bands just before the slivers that read them (2%), and
    # padding the next entry into a second buffer during this one (2%: both no longer fit L2).
    # Else (few entries): pad them all, then ~16 (entry, run of slivers) items per thread.
    return f"""
{spec.linkage} void {spec.name}(const float* __restrict X, const float* __restrict Wt, {params}{pre}, int nthreads) {{
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  const bool whole = {batch} % nth == 0 || {batch} >= 4 * nth;
{_weight(spec, g)}  float* xp = whole ? nullptr : vg_scratch(1, {batch * entry + g.slack});
  if (!whole) std::memset(xp + {batch * entry}, 0, sizeof(float) * {g.slack});
  const long chunks = whole ? 1 : vg_min({g.nsl}, (16 * nth + {batch - 1}) / {batch});
  const long per = ({g.nsl} + chunks - 1) / chunks;
#pragma omp parallel num_threads(nth)
  {{
    if (whole) {{
#pragma omp for schedule(dynamic, 1)
      for (long bi = 0; bi < {batch}; ++bi) {{
        float* xb = vg_scratch(1, {entry + g.slack});
        for (long c = 0; c < {g.cg}; ++c) {spec.name}_pad(X + (bi * {g.cg} + c) * {hw}, xb + c * {g.plane}, 0, {g.hp});
        std::memset(xb + {entry}, 0, sizeof(float) * {g.slack});
        {span}(ap, xb, Y, bi, 0, {g.nsl}{epi.names()});
      }}
    }} else {{
#pragma omp for schedule(dynamic, 16)
      for (long pl = 0; pl < {spec.n * spec.c_in}; ++pl) {spec.name}_pad(X + pl * {hw}, xp + pl * {g.plane}, 0, {g.hp});
#pragma omp for schedule(dynamic, 1)
      for (long w = 0; w < {batch} * chunks; ++w) {{
        const long bi = w / chunks, s0 = (w % chunks) * per;
        {span}(ap, xp + bi * {entry}, Y, bi, s0, vg_min({g.nsl}, s0 + per){epi.names()});
      }}
    }}
  }}
}}
"""


def _weight(spec: ConvSpec, g: _Geom) -> str:
    """C++: `ap`, the packed weight, by the calling thread: into scratch on every call, or once ever
    into the arena when it is constant (conv_prepack.py). Why not in the parallel region: it would
    need a barrier, which costs a whole time slice when the other thread has lost its core."""
    pack = f"for (long blk = 0; blk < {spec.groups * g.mpad // g.mr}; ++blk) {spec.name}_pack_w(Wt, ap, blk);"
    if spec.prepack:
        return weight_once(pack)
    return f"  float* ap = vg_scratch(0, {spec.groups * g.mpad * g.k});\n  {pack}\n"


# Why limits: the per-thread OCg x NR tile lives on the stack, and the padded copy of the whole
# batch in scratch; past these, the implicit-GEMM path (no such buffers) is the safer choice.
_MAX_TILE_FLOATS = 16384
_MAX_PADDED_FLOATS = 64 << 20


def direct_fits(spec: ConvSpec, mr: int, nr: int, lanes: int = 16) -> bool:
    """Whether render_conv2d_direct handles this geometry within its buffer limits."""
    g = _Geom(spec, mr, nr, None, lanes)
    return g.mpad * nr <= _MAX_TILE_FLOATS and spec.n * spec.c_in * g.plane + g.slack <= _MAX_PADDED_FLOATS


def render_conv2d_direct(
    spec: ConvSpec, epilogue: Epilogue, mr: int, nr: int, icb: int | None = None, lanes: int = 16
) -> str:
    """The kernel's C++ source (see module doc; strided: phase planes, `_Geom._phase_geometry`);
    mr x nr is the register tile."""
    if getattr(epilogue, "out_ctype", "float") != "float":
        raise ValueError(f"{spec.name}: the direct path stores fp32 only")
    check_tile(mr, nr, lanes)
    g = _Geom(spec, mr, nr, icb, lanes)
    phases = f", {len(g.phases)} phase planes" if g.phases else ""
    header = f"// vfuse conv2d (direct, padded width {g.wp}{phases}) {spec.name}: {spec}, epilogue {epilogue.name}\n"
    return (
        render_prelude()
        + (PREPACK_ONCE if spec.prepack else "")
        + header
        + _ukr(spec.name, g, g.mr)
        + (_ukr(spec.name, g, g.ocg % g.mr) if g.ocg % g.mr else "")
        + _pack_and_pad(spec, g)
        + _runs(spec, g)
        + _epilogue(spec, g, epilogue)
        + _epilogue(spec, g, epilogue, to_y=True)
        + _copy(spec, g)
        + _sliver(spec, g, epilogue)
        + _span(spec, g, epilogue)
        + _entry(spec, g, epilogue)
    )
