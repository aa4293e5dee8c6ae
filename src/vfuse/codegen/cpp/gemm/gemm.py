"""render_gemm: C[b] = epilogue(A[b] @ B[b]) as one self-contained C++17 function.

Generated signature:
    <linkage> void <name>(const float* A, const float* B, OUT* C, <epilogue args>, int nthreads)

A is row-major M x K (row stride lda), B is row-major K x N (ldb) or, with trans_b, N x K (ldb)
as nn.Linear stores its weight; C is row-major M x N (ldc) of the epilogue's `out_ctype` (OUT,
float unless the epilogue ends in a cast). An operand with a `Prologue` (`prologue.py`) is
computed by its packer from the epilogue args instead (its pointer is unused: pass nullptr),
e.g. int8 weights dequantized per channel. Batch dims broadcast through zero strides. All
sizes are baked in as constants (shapes are static in vfuse today), so GCC specializes the
loops. nthreads <= 0 means omp_get_max_threads().
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field

from vfuse.codegen.cpp.gemm.blocking import Blocking, CallBlocks, choose_blocking
from vfuse.codegen.cpp.gemm.driver import Driver, render_driver
from vfuse.codegen.cpp.gemm.epilogue import Epilogue, EpilogueArg
from vfuse.codegen.cpp.gemm.microkernel import PACKERS, render_microkernel
from vfuse.codegen.cpp.gemm.prelude import render_prelude
from vfuse.codegen.cpp.gemm.prologue import Prologue, packer_name, render_packer
from vfuse.schedule.blocks import shared_a as shared_a_rule
from vfuse.schedule.microtile import AVX512, VectorUnit

# This machine's caches (per-core L1d/L2, shared L3): the default when no Target is given.
DEFAULT_CACHES = (48 << 10, 1 << 20, 32 << 20)


def check_kernel_name(name: str) -> None:
    """Kernel names become C function names in the generated translation unit."""
    if not (name.isidentifier() and name.isascii()):
        raise ValueError(f"kernel name {name!r} is not a C identifier")


@dataclass(frozen=True, slots=True)
class GemmSpec:
    """Shapes and element strides of one (batched) fp32 GEMM.

    batch: batch dims (possibly empty); a/b/c_batch_strides: one element stride per batch dim,
    0 where that operand broadcasts. lda/ldb/ldc default to the dense row length.
    caches: (l1, l2, l3) bytes for blocking; unit: the vector unit the register tile is for;
    blocking overrides the choice entirely; `call` (blocks per call over a symbolic M, the
    schedule's) overrides it in each call, `blocking` being its first piece.
    a_prologue / b_prologue: compute that operand while packing (B then has no trans_b).
    """

    name: str
    m: int
    n: int
    k: int
    trans_b: bool = False
    batch: tuple[int, ...] = ()
    a_batch_strides: tuple[int, ...] = ()
    b_batch_strides: tuple[int, ...] = ()
    c_batch_strides: tuple[int, ...] = ()
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    linkage: str = 'extern "C"'
    caches: tuple[int, int, int] = DEFAULT_CACHES
    blocking: Blocking | None = field(default=None)
    unit: VectorUnit = AVX512
    a_prologue: Prologue | None = None
    b_prologue: Prologue | None = None
    prepack: bool = False  # B packed once into the caller's `char* vg_pre` (driver.py, prepack.py)
    call: CallBlocks | None = None
    # A packed once per call before the driver: the schedule's (`ContractionKernel.shared_a`); None: its rule.
    shared_a: bool | None = None

    def __post_init__(self) -> None:
        check_kernel_name(self.name)
        if self.trans_b and self.b_prologue is not None:
            raise ValueError(f"{self.name}: a B prologue reads B's elements itself (no trans_b)")
        if self.m < 1 or self.n < 1 or self.k < 1:  # each proved for symbolic sizes, not compared
            raise ValueError(f"{self.name}: empty GEMM {self.m}x{self.k} @ {self.k}x{self.n}")
        strides = (self.a_batch_strides, self.b_batch_strides, self.c_batch_strides)
        if any(len(s) != len(self.batch) for s in strides):
            raise ValueError(f"{self.name}: need one batch stride per batch dim {self.batch}")
        if self.prepack and any(self.b_batch_strides):
            raise ValueError(f"{self.name}: a prepacked B must be one matrix for every batch entry")

    @classmethod
    def from_shapes(
        cls, name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_b: bool = False, **kw: object
    ) -> GemmSpec:
        """The spec for torch.matmul(a, b) (or a @ b.mT with trans_b) on contiguous tensors.

        Batch dims broadcast as in torch: missing or size-1 dims of an operand get stride 0.
        """
        m, k = a_shape[-2:]
        n = b_shape[-2] if trans_b else b_shape[-1]
        if (b_shape[-1] if trans_b else b_shape[-2]) != k:
            raise ValueError(f"{name}: inner dims differ: {a_shape} @ {b_shape} (trans_b={trans_b})")
        rank = max(len(a_shape), len(b_shape)) - 2
        a_b, b_b = (1,) * (rank + 2 - len(a_shape)) + a_shape[:-2], (1,) * (rank + 2 - len(b_shape)) + b_shape[:-2]
        batch = tuple(max(x, y) for x, y in zip(a_b, b_b, strict=True))
        if any(d not in (1, b) for dims in (a_b, b_b) for d, b in zip(dims, batch, strict=True)):
            raise ValueError(f"{name}: batch dims do not broadcast: {a_shape} @ {b_shape}")
        return cls(
            name, m, n, k, trans_b, batch, _strides(a_b, m * k), _strides(b_b, k * n), _strides(batch, m * n), **kw
        )

    @property
    def lead(self) -> tuple[int, int, int]:
        ldb_dense = self.k if self.trans_b else self.n
        return (self.lda or self.k, self.ldb or ldb_dense, self.ldc or self.n)

    def tiles(self) -> Blocking:
        return self.blocking or choose_blocking(self.m, self.n, self.k, *self.caches, unit=self.unit)


def _strides(dims: tuple[int, ...], inner: int) -> tuple[int, ...]:
    """Contiguous element strides of batch dims over `inner`-element matrices; 0 for size-1 dims."""
    out, step = [], inner
    for d in reversed(dims):
        out.append(step if d != 1 else 0)
        step *= d
    return tuple(reversed(out))


def batch_setup(spec: GemmSpec, out_ctype: str = "float") -> str:
    """Decompose the flat batch index into per-operand offsets (innermost dim varies fastest).
    An operand computed by its prologue has no pointer (A / B may be null)."""
    lines = ["  long rem = bi, ao = 0, bo = 0, co = 0;\n"]
    dims = zip(spec.batch, spec.a_batch_strides, spec.b_batch_strides, spec.c_batch_strides, strict=True)
    for size, sa, sb, sc in reversed(list(dims)):
        offsets = f"ao += x * {sa}; bo += x * {sb}; co += x * {sc};"
        lines.append(f"  {{ const long x = rem % {size}; rem /= {size}; {offsets} }}\n")
    lines.append("  (void)rem; (void)ao; (void)bo;\n")
    if spec.a_prologue is None:
        lines.append("  const float* __restrict a_b = A + ao;\n")
    if spec.b_prologue is None:
        lines.append("  const float* __restrict b_b = B + bo;\n")
    lines.append(f"  {out_ctype}* __restrict c_b = C + co;\n")
    return "".join(lines)


def _packers(spec: GemmSpec, blk: Blocking, epilogue: Epilogue) -> tuple[str, str, str]:
    """(packer functions, the A block packing statement, the B sliver packing statement)."""
    _, ldb, _ = spec.lead
    source, pack_a = "", ""
    names = epilogue.names()
    if spec.a_prologue is not None:
        source += render_packer(spec.name, "a", blk.mr, spec.a_prologue, epilogue.params())
        if spec.a_prologue.inner == "r":  # one call packs the block, a K step at a time (prologue.py)
            pack_a = f"{packer_name(spec.name, 'a')}(bi, ic, pc, mcur, kc, ap{names});"
        else:
            rows = f"vg_min({blk.mr}, mcur - ir)"
            call = f"{packer_name(spec.name, 'a')}(bi, ic + ir, pc, {rows}, kc, ap + ir * kc{names});"
            pack_a = f"for (long ir = 0; ir < mcur; ir += {blk.mr}) {call}"
    if spec.b_prologue is not None:
        source += render_packer(spec.name, "b", blk.nr, spec.b_prologue, epilogue.params())
        pack_b = f"{packer_name(spec.name, 'b')}(bi, j, pc, nr, kc, bps{names});"
    elif spec.trans_b:
        pack_b = f"vg_pack_b_cols<{blk.nr}, {blk.tw}>(b_b + j * {ldb} + pc, {ldb}, kc, nr, bps);"
    else:
        pack_b = f"vg_pack_b_rows<{blk.nr}>(b_b + pc * {ldb} + j, {ldb}, kc, nr, bps);"
    return source, pack_a, pack_b


def _pack_b_span(spec: GemmSpec, blk: Blocking) -> str:
    """A plain row-major B packs a panel's slivers row by row (vg_pack_b_rows_span)."""
    if spec.b_prologue is not None or spec.trans_b:
        return ""
    ldb = spec.lead[1]
    return f"vg_pack_b_rows_span<{blk.nr}>(b_b + pc * {ldb} + jc, {ldb}, kc, {spec.n} - jc, sa, sb, sstride, bp);"


def _mpad(spec: GemmSpec, blk: Blocking) -> int:
    return -(-spec.m // blk.mr) * blk.mr


def _shared_a(spec: GemmSpec, blk: Blocking) -> bool:
    """The schedule's `shared_a` (`ContractionKernel.shared_a`); a spec rendered outside a Program
    (template tests) gets the schedule's rule at its sizes."""
    if spec.shared_a is not None:
        return spec.shared_a
    return shared_a_rule(spec.m, spec.n, spec.k, math.prod(spec.batch), blk)


def _pack_all_a(spec: GemmSpec, blk: Blocking, epi: Epilogue) -> str:
    """NAME_pack_all: A in the layout the driver packs per block (per KC block at pc * Mpad, MR-row
    slivers at ic * kc), one (block, sliver) per iteration over the threads; k-major with the MR
    rows innermost, whole slivers in register transposes (vg_pack_t)."""
    lda = spec.lead[0]
    mr, mpad, slivers, blocks = blk.mr, _mpad(spec, blk), _mpad(spec, blk) // blk.mr, -(-spec.k // blk.kc)
    if spec.a_prologue is not None:
        pack = f"{packer_name(spec.name, 'a')}(0, ic, pc, rows, kc, d{epi.names()});"
    else:
        pack = f"""const float* __restrict w = A + ic * {lda} + pc;
    if (rows == {mr}) {{
      vg_pack_t<{mr}, {blk.tw}>(w, {lda}, kc, d);
    }} else {{
      for (long kk = 0; kk < kc; ++kk)
        for (int r = 0; r < {mr}; ++r) d[kk * {mr} + r] = r < rows ? w[r * {lda} + kk] : 0.0f;
    }}"""
    return f"""
static void {spec.name}_pack_all(const float* __restrict A, float* __restrict ap, long nth{epi.params()}) {{
  (void)A;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
  for (long t = 0; t < {blocks * slivers}; ++t) {{
    const long pc = t / {slivers} * {blk.kc}, ic = t % {slivers} * {mr};
    const long kc = vg_min({blk.kc}, {spec.k} - pc), rows = vg_min({mr}, {spec.m} - ic);
    float* __restrict d = ap + pc * {mpad} + ic * kc;
    {pack}
  }}
}}
"""


def _shared_a_entry(spec: GemmSpec, blk: Blocking, epi: Epilogue, params: str) -> str:
    """NAME: packs A once (`_shared_a`), then runs the driver (NAME_gemm) reading it in place.
    The buffer is the calling thread's slot 0, sized so the driver's own request never regrows it."""
    floats = max(_mpad(spec, blk) * spec.k, -(-blk.mc // blk.mr) * blk.mr * blk.kc)
    pre, pre_arg = (", char* __restrict vg_pre", ", vg_pre") if spec.prepack else ("", "")
    return f"""
{spec.linkage} void {spec.name}({params}{epi.params()}{pre}, int nthreads) {{
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  float* ap = vg_scratch(0, {floats});
  {spec.name}_pack_all(A, ap, nth{epi.names()});
  {spec.name}_gemm(A, B, C, ap{epi.names()}{pre_arg}, nthreads);
}}
"""


def _instance(spec: GemmSpec, epilogue: Epilogue) -> str:
    """Packers, driver and entry function `spec.name` of one GEMM (no prelude)."""
    lda, _, ldc = spec.lead
    blk = spec.tiles()
    packers, pack_a, pack_b = _packers(spec, blk, epilogue)
    params = f"const float* __restrict A, const float* __restrict B, {epilogue.out_ctype}* __restrict C"
    shared = _shared_a(spec, blk)
    if shared:
        pack_a = f"ap = const_cast<float*>(Ap) + pc * {_mpad(spec, blk)} + ic * kc;"
    driver = Driver(
        name=f"{spec.name}_gemm" if shared else spec.name,
        linkage="static" if shared else spec.linkage,
        params=params + (", const float* __restrict Ap" if shared else ""),
        args="A, B, C" + (", Ap" if shared else ""),
        batch=math.prod(spec.batch),
        m=spec.m,
        n=spec.n,
        k=spec.k,
        lda=lda,
        ldc=ldc,
        batch_setup=batch_setup(spec, epilogue.out_ctype),
        pack_b=pack_b,
        pack_b_span=_pack_b_span(spec, blk),
        row_names="    [[maybe_unused]] const long b = bi;\n",
        pack_a=pack_a,
        prepack=spec.prepack,
        call=spec.call,
    )
    return (
        packers
        + render_driver(driver, blk, epilogue)
        + (_pack_all_a(spec, blk, epilogue) + _shared_a_entry(spec, blk, epilogue, params) if shared else "")
    )


# Identical GEMMs (every layer's Q/K/V projection: the same shapes and epilogue on other
# buffers) are rendered once per translation unit: each instance is named and include-guarded
# by the hash of its text with the epilogue's arguments renamed to vg_e0, vg_e1, ..., and the
# kernel's function only calls it. g++ then optimizes one copy per unit instead of one per layer
# (~0.2-0.3 s of CPU each: docs/perf-log.md). `seeds` keeps its name: the symbolic sizes'
# macros (`vf_s0`, render.py) read it; the prelude's names (vg_/vs_/vf_) are never arguments.
_INSTANCE = "vg_gemm_INSTANCE"
_KEPT = re.compile(r"seeds|v[gsf]_\w*")


def _in_use_order(spec: GemmSpec, epilogue: Epilogue) -> Epilogue:
    """`epilogue` with its arguments in the order the code first names them (prologues, then the
    epilogue's statements; unnamed ones after, in their order): the extras come sorted by their
    values' names, and two layers' `getitem_11, getitem_8` and `getitem, getitem_3` swap roles."""
    pro = [*(spec.a_prologue.body if spec.a_prologue else ()), *(spec.b_prologue.body if spec.b_prologue else ())]
    pro += [p.value for p in (spec.a_prologue, spec.b_prologue) if p is not None]
    code = "\n".join([*pro, *epilogue.body, epilogue.store, epilogue.colsum])

    def first(arg: EpilogueArg) -> int:
        m = re.search(rf"\b{re.escape(arg.name)}\b", code)
        return m.start() if m else len(code)

    return dataclasses.replace(epilogue, args=tuple(sorted(epilogue.args, key=first)))


def _renamed(text: str, epilogue: Epilogue) -> str | None:
    """`text` with the epilogue's arguments renamed canonically (a whole-token rename of each:
    the same C++), or None where a canonical name is taken already."""
    if re.search(r"\bvg_e\d+\b", text):
        return None
    for i, arg in enumerate(epilogue.args):
        if not _KEPT.fullmatch(arg.name):
            text = re.sub(rf"\b{re.escape(arg.name)}\b", f"vg_e{i}", text)
    return text


def render_gemm(spec: GemmSpec, epilogue: Epilogue) -> str:
    """The kernel's C++ source: guarded prelude, micro-kernel and packers, the shared instance
    (guarded: once per unit) and the kernel's function `spec.name` calling it."""
    blk = spec.tiles()
    # noinline: each caller is a one-line forward, not a copy of the driver to optimize again
    # (on a line of its own: report/source.py finds functions by their `static` lines).
    canonical = dataclasses.replace(spec, name=_INSTANCE, linkage="__attribute__((noinline))\nstatic")
    ordered = _in_use_order(spec, epilogue)
    body = _renamed(_instance(canonical, ordered), ordered)
    header = f"// vfuse gemm {spec.name}: {spec.m}x{spec.k} @ {spec.k}x{spec.n}, epilogue {epilogue.name}, {blk}\n"
    if spec.call is not None and len(spec.call.blocks) > 1:
        where = f"(M, K) within {spec.call.within}" if spec.call.within else f"above M = {spec.call.upto}"
        header += f"// blocks per call: {spec.call.blocks[1:]} {where}\n"
    common = render_prelude() + PACKERS + render_microkernel(blk.mr, blk.nr, blk.lanes) + header
    if body is None:
        return common + _instance(spec, epilogue)
    digest = hashlib.sha256(body.encode()).hexdigest()[:20]
    name = f"vg_gemm_{digest}"
    guarded = f"#ifndef VG_GEMM_{digest}\n#define VG_GEMM_{digest}\n{body.replace(_INSTANCE, name)}#endif\n"
    pre, pre_arg = (", char* __restrict vg_pre", ", vg_pre") if spec.prepack else ("", "")
    params = f"const float* __restrict A, const float* __restrict B, {epilogue.out_ctype}* __restrict C"
    forward = (
        f"{spec.linkage} void {spec.name}({params}{epilogue.params()}{pre}, int nthreads) {{\n"
        f"  {name}(A, B, C{ordered.names()}{pre_arg}, nthreads);\n}}\n"
    )
    return common + guarded + forward
