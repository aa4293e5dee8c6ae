"""render_conv2d: out = epilogue(conv2d(x, w)) as one C++17 function.

Stride-1 convs with a spatial kernel take the direct padded-width path (conv_direct.py: B read
straight from a zero-padded copy of X, no gather); every other geometry (strides, the 1x1
pointwise case, buffers past conv_direct's limits) the implicit GEMM described here.

Generated signature:
    <linkage> void <name>(const float* X, const float* Wt, float* Y, <epilogue args>, int nthreads)

X is NCHW, Wt is OIHW (contiguous), Y is NCHW (contiguous). For each (image n, group g) the
kernel computes Y[n, g] (OCg x OH*OW) = Wt[g] (OCg x Cg*KH*KW) @ im2col(X[n, g]) with the GEMM
driver: the weight is the A operand (its OIHW rows already are the K = (ic, kh, kw) order), and
B slivers are gathered straight from X into the packed panel (im2col of one KC x NR tile at a
time, never the whole matrix). The output's NCHW rows are GEMM rows, so writeback stores
contiguous runs and the epilogue sees n, c (output channel), p = oh * OW + ow and o.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vfuse.codegen.cpp.gemm.blocking import Blocking, choose_blocking
from vfuse.codegen.cpp.gemm.conv_direct import direct_fits, render_conv2d_direct
from vfuse.codegen.cpp.gemm.conv_phases import phase_copy, phased, phased_im2col
from vfuse.codegen.cpp.gemm.conv_prepack import PREPACK_ONCE, prepack_param, weight_once
from vfuse.codegen.cpp.gemm.driver import Driver, render_driver
from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.gemm import DEFAULT_CACHES, check_kernel_name
from vfuse.codegen.cpp.gemm.microkernel import PACKERS, render_microkernel
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.ir.sym import is_sym
from vfuse.schedule.blocks import CallBlocks, ConvBlocks
from vfuse.schedule.microtile import AVX512, VectorUnit

Pair = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """Shapes of one fp32 NCHW x OIHW conv2d (torch.nn.functional.conv2d semantics, no bias)."""

    name: str
    n: int
    c_in: int
    h: int
    w: int
    c_out: int
    kh: int
    kw: int
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    dilation: Pair = (1, 1)
    groups: int = 1
    linkage: str = 'extern "C"'
    caches: tuple[int, int, int] = DEFAULT_CACHES
    blocking: Blocking | None = field(default=None)
    unit: VectorUnit = AVX512
    # The weight is a constant (a frozen parameter, `ContractionKernel.prepacked_b`): packed once, on
    # the first call, into the arena slot the entry takes as `char* vg_pre` (gemm/prepack.py).
    prepack: bool = False
    # The direct path computes OH x OW compact columns, no garbage ones: decided by the schedule
    # (`ContractionKernel.attrs["compact"]`, schedule/contraction.py, rule microtile.compact_conv_columns).
    compact: bool = False
    # The direct path's channel blocks and the folded template's threaded passes: the schedule's
    # (`ContractionKernel.conv_blocks`, schedule/conv_blocks.py); None: its rules at these sizes.
    # Not in the repr the source's header shows.
    blocks: ConvBlocks | None = field(default=None, repr=False)
    # The GEMM's cache blocks per call (pieces over a symbolic K: the folded weight gradient's batch;
    # `schedule/conv_blocks.py`); `blocking` is its first piece. None: `blocking` at every size.
    call: CallBlocks | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_kernel_name(self.name)
        if self.c_in % self.groups or self.c_out % self.groups:
            raise ValueError(f"{self.name}: channels {self.c_in}->{self.c_out} not divisible by groups {self.groups}")
        if any(d < 1 for d in self.out_hw):  # each proved (symbolic planes): min() would compare OH with OW
            raise ValueError(f"{self.name}: empty output {self.out_hw}")

    @property
    def out_hw(self) -> Pair:
        def size(x: int, k: int, s: int, p: int, d: int) -> int:
            return (x + 2 * p - d * (k - 1) - 1) // s + 1

        sh, sw = self.stride
        ph, pw = self.padding
        dh, dw = self.dilation
        return size(self.h, self.kh, sh, ph, dh), size(self.w, self.kw, sw, pw, dw)

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        oh, ow = self.out_hw
        return self.c_out // self.groups, oh * ow, self.c_in // self.groups * self.kh * self.kw

    def tiles(self) -> Blocking:
        return self.blocking or choose_blocking(*self.gemm_mnk, *self.caches, unit=self.unit)

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: im2col(X[n, g]) is X[n, g] itself viewed as Cg x H*W."""
        return (self.kh, self.kw, self.stride, self.padding) == (1, 1, (1, 1), (0, 0))


def _im2col(spec: ConvSpec, nr: int) -> str:
    """NAME_im2col: rows [pc, pc + kc) x columns [j, j + nr) of im2col(x) -> one packed sliver."""
    ow_n = spec.out_hw[1]
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    h, w, kh, kw = spec.h, spec.w, spec.kh, spec.kw
    return f"""
// Output columns of a sliver form a few runs along one output row (found once per sliver);
// per K row, each run is one (strided) row segment of X clipped to the padding.
static inline void {spec.name}_im2col(const float* __restrict x, long pc, long kc, long j, long nr,
                                      float* __restrict bps{_SEEDS if symbolic(spec) else ""}) {{
  long run_c[{nr + 1}], run_oh[{nr}], run_ow[{nr}];
  int nrun = 0;
  for (long c = 0; c < nr; ++nrun) {{
    const long p = j + c, oh = p / {ow_n}, ow = p % {ow_n};
    run_c[nrun] = c; run_oh[nrun] = oh * {sh} - {ph}; run_ow[nrun] = ow * {sw} - {pw};
    c += vg_min({ow_n} - ow, nr - c);
  }}
  run_c[nrun] = nr;
{_table_path(spec, nr) if sw == 1 else ""}  long ic = pc / {kh * kw}, kh = (pc / {kw}) % {kh}, kw = pc % {kw};
  for (long kk = 0; kk < kc; ++kk) {{
    float* __restrict dst = bps + kk * {nr};
    const float* __restrict plane = x + ic * {h * w};
    for (int r = 0; r < nrun; ++r) {{
      const long c0 = run_c[r], len = run_c[r + 1] - c0, ih = run_oh[r] + kh * {dh};
      const long base = run_ow[r] + kw * {dw};
      long qlo = vg_min(len, base >= 0 ? 0 : (-base + {sw - 1}) / {sw});
      long qhi = vg_min(len, base >= {w} ? 0 : ({w} - base + {sw - 1}) / {sw});
      if (ih < 0 || ih >= {h}) qlo = qhi = 0;  // a padding row: all zeros, `row` is never read
      vg_segment<{sw}>(dst + c0, plane + ih * {w}, base, len, qlo, qhi);
    }}
    for (long q = nr; q < {nr}; ++q) dst[q] = 0.0f;
    if (++kw == {kw}) {{ kw = 0; if (++kh == {kh}) {{ kh = 0; ++ic; }} }}
  }}
}}
"""


# Symbolic planes (`vf_s0`: `seeds[k]`, ir/sym.py) in a helper the driver calls: it takes the
# driver's `seeds` (the epilogue's argument in a symbolic program).
_SEEDS = ", const int64_t* __restrict seeds"


def symbolic(spec: ConvSpec) -> bool:
    """Whether the conv's planes are symbolic sizes (the implicit GEMM only: schedule/conv_blocks.py)."""
    return any(is_sym(d) for d in (spec.h, spec.w))


def _table_path(spec: ConvSpec, nr: int) -> str:
    """Stride-1 AVX-512 im2col: per (kh, kw), the sliver's masked 16-lane pieces are the same for
    every input channel, so they are computed once and each K row is just masked load/stores.
    Measured on conv_bn_relu (8x64x56x56, 3x3, one thread): 12.2 ms -> 8.7 ms for the whole conv."""
    taps, seg_max = spec.kh * spec.kw, nr + 2 * (nr // 16) + 1
    (dh, dw), (h, w) = spec.dilation, (spec.h, spec.w)
    return f"""#if defined(__AVX512F__)
  {{  // own scope: the portable path below declares the same names
  VgSeg seg[{taps}][{seg_max}];
  int nseg[{taps}];
  for (int tap = 0; tap < {taps}; ++tap) {{
    const long kh = tap / {spec.kw}, kw = tap % {spec.kw};
    int n = 0;
    for (int r = 0; r < nrun; ++r) {{
      const long c0 = run_c[r], len = run_c[r + 1] - c0, ih = run_oh[r] + kh * {dh}, base = run_ow[r] + kw * {dw};
      const bool row_ok = ih >= 0 && ih < {h};
      const long qlo = base >= 0 ? 0 : -base, qhi = {w} - base;
      for (long q0 = 0; q0 < len; q0 += 16)
        seg[tap][n++] = {{ih * {w} + base + q0, c0 + q0, row_ok ? vg_lanes(qlo - q0, qhi - q0) : __mmask16(0),
                         vg_lanes(0, len - q0)}};
    }}
    for (long q0 = nr; q0 < {nr}; q0 += 16) seg[tap][n++] = {{0, q0, __mmask16(0), vg_lanes(0, {nr} - q0)}};
    nseg[tap] = n;
  }}
  // Tap-major: for one (tap, piece) the masks and offsets stay in registers while the loop walks
  // the input channels in this K block (K row = ic * taps + tap), two instructions per piece.
  for (int tap = 0; tap < {taps}; ++tap) {{
    const long ic0 = pc > tap ? (pc - tap + {taps - 1}) / {taps} : 0;
    const long ic1 = pc + kc > tap ? (pc + kc - tap + {taps - 1}) / {taps} : 0;
    for (int s = 0; s < nseg[tap]; ++s) {{
      const VgSeg e = seg[tap][s];
      const float* __restrict src = x + ic0 * {h * w} + e.off;
      float* __restrict d = bps + (ic0 * {taps} + tap - pc) * {nr} + e.dst;
      for (long ic = ic0; ic < ic1; ++ic, src += {h * w}, d += {taps * nr})
        _mm512_mask_storeu_ps(d, e.store, _mm512_maskz_loadu_ps(e.load, src));
    }}
  }}
  return;
  }}
#endif
"""


def _batch_setup(spec: ConvSpec) -> str:
    m, n_cols, k = spec.gemm_mnk
    g, cg = spec.groups, spec.c_in // spec.groups
    x_b = f"X + n_ * {spec.c_in * spec.h * spec.w} + g_ * {cg * spec.h * spec.w}"
    if phased(spec):  # this thread's phased copy of the entry's input (conv_phases.py)
        x_b = f"{spec.name}_phases({x_b})"
    return (
        f"  const long n_ = bi / {g}, g_ = bi % {g};\n"
        f"  const float* __restrict a_b = Wt + g_ * {m * k};\n"
        f"  const float* __restrict x_b = {x_b};\n"
        f"  const long co = n_ * {spec.c_out * n_cols} + g_ * {m * n_cols};\n"
        f"  float* __restrict c_b = Y + co;\n"
    )


def render_conv2d(spec: ConvSpec, epilogue: Epilogue) -> str:
    """The kernel's C++ source: the direct path where it applies (see module doc), else implicit
    GEMM. Direct vs implicit GEMM, one thread: conv_bn_relu 7.7 vs 8.9 ms; other stride-1 3x3/5x5
    geometries 0.76-0.93x the time, except 3 -> 64 channels at 224x224 (1.07-1.2x)."""
    blk = spec.tiles()
    # The direct path stores fp32 `v`; an epilogue with another output (getattr: those fields
    # are new to Epilogue) keeps the driver's path.
    fp32_out = getattr(epilogue, "out_ctype", "float") == "float" and getattr(epilogue, "store", "v") == "v"
    # The direct path or the implicit GEMM: the schedule's (ConvSpec.blocks); outside a Program, whether it fits.
    direct = spec.blocks.direct if spec.blocks is not None else direct_fits(spec, blk.mr, blk.nr, blk.lanes)
    if fp32_out and not spec.is_pointwise and direct:
        return render_conv2d_direct(spec, epilogue, blk.mr, blk.nr, lanes=blk.lanes)
    return render_conv2d_gemm(spec, epilogue)


def render_conv2d_gemm(spec: ConvSpec, epilogue: Epilogue) -> str:
    """Implicit GEMM through the shared driver: guarded prelude, micro-kernel and packers, gather,
    then the function. Any geometry."""
    m, n_cols, k = spec.gemm_mnk
    blk = spec.tiles()
    if spec.is_pointwise:
        pack = f"vg_pack_b_rows<{blk.nr}>(x_b + pc * {n_cols} + j, {n_cols}, kc, nr, bps);"
        gather = ""
    else:
        pack = f"{spec.name}_im2col(x_b, pc, kc, j, nr, bps{', seeds' if symbolic(spec) else ''});"
        gather = phase_copy(spec) + phased_im2col(spec, blk.nr) if phased(spec) else _im2col(spec, blk.nr)
    params = "const float* __restrict X, const float* __restrict Wt, float* __restrict Y"
    # Images share the weight: packed once per call where the schedule says (ConvSpec.blocks; outside a
    # Program, with several images), or once ever when it is constant (_packed_weight).
    shared_a = (spec.blocks.weight_once if spec.blocks is not None else spec.n > 1) or spec.prepack
    driver = Driver(
        name=f"{spec.name}_gemm" if shared_a else spec.name,
        linkage="static" if shared_a else spec.linkage,
        params=params + (", const float* __restrict Ap" if shared_a else ""),
        args="X, Wt, Y" + (", Ap" if shared_a else ""),
        batch=spec.n * spec.groups,
        m=m,
        n=n_cols,
        k=k,
        lda=k,
        ldc=n_cols,
        batch_setup=_batch_setup(spec),
        pack_b=pack,
        row_names=f"    [[maybe_unused]] const long n = bi / {spec.groups}, c = (bi % {spec.groups}) * {m} + i;\n",
        elem_names="      [[maybe_unused]] const long p = j;\n",
        pack_a=_packed_block(spec, blk) if shared_a else "",
    )
    header = f"// vfuse conv2d {spec.name}: {spec}, epilogue {epilogue.name}, {blk}\n"
    body = render_driver(driver, blk, epilogue)
    if shared_a:
        body += _packed_weight(spec, blk, params, epilogue)
    return render_prelude() + PACKERS + render_microkernel(blk.mr, blk.nr, blk.lanes) + gather + header + body


def _mpad(spec: ConvSpec, blk: Blocking) -> int:
    return -(-spec.gemm_mnk[0] // blk.mr) * blk.mr


def _packed_block(spec: ConvSpec, blk: Blocking) -> str:
    """The driver's A block (rows ic.., K columns pc..) inside the weight packed by NAME_pack_all:
    per group, per KC block (at pc * Mpad), MR-row slivers of kc x MR floats (the sliver at row ic
    at ic * kc): the layout vg_pack_a writes per block, so the micro-kernel reads it in place."""
    k = spec.gemm_mnk[2]
    return f"ap = const_cast<float*>(Ap) + g_ * {k * _mpad(spec, blk)} + pc * {_mpad(spec, blk)} + ic * kc;"


def _packed_weight(spec: ConvSpec, blk: Blocking, params: str, epi: Epilogue) -> str:
    """NAME: packs the weight once for all images, then runs the driver (NAME_gemm) on it.

    Why: the driver packs A per batch entry, and a conv's A (the weight) is the same for every
    image: a strided pass over the whole weight per image, ~1/4 of a 2-image 16x16 -> 8x8 conv's
    time (perf, AVX2, 128 -> 256 channels). Packed by the calling thread, before the driver's
    parallel region, into a buffer of its own that every thread reads: a parallel pack would add a
    fork and join per call, which costs a time slice when a thread has lost its core (conv_direct.py
    packs its weight the same way); the images' threads packed concurrently before, so with one
    image per thread the wall time of a (now 1.8x faster) pack is what it was at most. A constant
    weight (`spec.prepack`) is packed on the first call only, into the arena (conv_prepack.py)."""
    m, _, k = spec.gemm_mnk
    mpad, slivers = _mpad(spec, blk), _mpad(spec, blk) // blk.mr
    blocks = -(-k // blk.kc)
    name, total = spec.name, spec.groups * k * mpad
    return f"""{_abuf(name, total) if not spec.prepack else PREPACK_ONCE}
static void {name}_pack_all(const float* __restrict Wt, float* __restrict ap) {{
  for (long t = 0; t < {spec.groups * blocks * slivers}; ++t) {{
    const long g = t / {blocks * slivers}, pc = (t / {slivers}) % {blocks} * {blk.kc}, ic = t % {slivers} * {blk.mr};
    const long kc = vg_min({blk.kc}, {k} - pc), rows = vg_min({blk.mr}, {m} - ic);
    const float* __restrict w = Wt + g * {m * k} + ic * {k} + pc;
    float* __restrict d = ap + g * {k * mpad} + pc * {mpad} + ic * kc;
    // k-major with the MR rows innermost, in register transposes (vg_pack_t).
    if (rows == {blk.mr}) {{
      vg_pack_t<{blk.mr}, {blk.tw}>(w, {k}, kc, d);
    }} else {{
      for (long kk = 0; kk < kc; ++kk)
        for (int r = 0; r < {blk.mr}; ++r) d[kk * {blk.mr} + r] = r < rows ? w[r * {k} + kk] : 0.0f;
    }}
  }}
}}

{spec.linkage} void {name}({params}{epi.params()}{prepack_param(spec.prepack)}, int nthreads) {{
{_weight(spec)}  {name}_gemm(X, Wt, Y, ap{epi.names()}, nthreads);
}}
"""


def _abuf(name: str, total: int) -> str:
    """NAME_abuf: the calling thread's buffer for the weight packed per call."""
    return f"""
static float* {name}_abuf() {{
  struct Buf {{ float* p = nullptr; ~Buf() {{ std::free(p); }} }};
  static thread_local Buf b;
  if (!b.p) b.p = static_cast<float*>(std::aligned_alloc(64, {-(-total * 4 // 64) * 64}));
  return b.p;
}}
"""


def _weight(spec: ConvSpec) -> str:
    """C++: `ap`, the packed weight: packed now into this thread's buffer, or once ever (prepack)."""
    if spec.prepack:
        return weight_once(f"{spec.name}_pack_all(Wt, ap);")
    return f"  float* ap = {spec.name}_abuf();\n  {spec.name}_pack_all(Wt, ap);\n"
