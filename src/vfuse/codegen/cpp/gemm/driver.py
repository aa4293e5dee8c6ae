"""The blocked GEMM loop nest shared by render_gemm and render_conv2d (C++ source text).

Both kernels are "for each batch entry: C_b[M x N] = A_b[M x K] @ B_b[K x N], then epilogue";
they differ only in how a batch entry's pointers are found, how a B sliver is packed (plain copy
vs. im2col gather) and which index names the epilogue sees. `Driver` carries those pieces as
short C++ fragments; this module owns the loops, threading and writeback.

Threading: when the batch count divides the threads (or dwarfs them) each thread runs whole
batch entries with private panels (no barriers). Otherwise all threads cooperate on one entry:
they pack the shared KC x NC panel of B together, barrier, then split (MC block x column chunk)
work items so every thread gets the same number of items. With a single MC block (small M: a
weight gradient dW = dY^T X, a conv's few output channels) each item is a column chunk that one
thread alone reads, so that thread packs its own slivers and no K block waits on a barrier.

Partial sums: with K > KC the tile of each K block is added to the previous partial sum, kept
in C itself for an fp32 output. An output of another type (the epilogue ends in a cast, e.g.
an int8 quantize) cannot hold them, so they go to an fp32 workspace of M x NC (one column
panel: every K block of a panel is done before the next panel starts), scratch slot 2, private
or shared exactly like the B panel. Why scratch rather than an arena buffer: it needs no IR
value, costs nothing when K <= KC (no workspace at all: the epilogue sees the final sum
straight from the micro-kernel) and is allocated once per thread like the packing buffers.
A work item covers the same rows and columns in every K block, so a thread only ever reads
back the partial sums it wrote.

Column sums (`Epilogue.colsum`, a bias gradient): on the last K block each tile adds its rows'
values per column, in row order, and stores them at its MR-row sliver's row of an fp32 partials
array (batch x slivers x N, scratch slot 2: no workspace exists with an fp32 C). Slivers start at
multiples of MR whatever the threads, so every partial is written once, by one thread, and the
entry sums them sliver by sliver after the parallel region: the same bits for any thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.codegen.cpp.gemm.blocking import Blocking, CallBlocks
from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.microkernel import microkernel_name
from vfuse.codegen.cpp.gemm.prepack import HEADER, PREPACK_ONCE, padded_n


@dataclass(frozen=True, slots=True)
class Driver:
    """Kernel-specific fragments. C++ names in scope are documented per field.

    params: the parameter list before the epilogue's args, e.g. "const float* A, const float* B, float* C".
    args: the same names as a call list ("A, B, C").
    batch_setup: given `long bi`, defines `const float* a_b`, `float* c_b`, `long co` (offset of
        c_b from the output pointer) and whatever pack_b needs.
    pack_b: packs columns [j, j + nr) and rows [pc, pc + kc) of B_b into `float* bps` (NR wide).
    pack_a: packs rows [ic, ic + mcur) and columns [pc, pc + kc) of A into `float* ap` (MR-row
        slivers); empty: vg_pack_a from `a_b` with leading dim lda.
    row_names / elem_names: statements defining the epilogue's index names from bi, i (row) and
        j (column); the generic `i`, `j`, `o` are always defined.
    The output pointer `c_b` has the epilogue's `out_ctype`.
    """

    name: str
    linkage: str
    params: str
    args: str
    batch: int
    m: int
    n: int
    k: int
    lda: int
    ldc: int
    batch_setup: str
    pack_b: str
    row_names: str = ""
    elem_names: str = ""
    pack_a: str = ""
    # Optional: packs slivers [sa, sb) of the (jc, pc) panel at `bp + s * sstride` in one call
    # (a row-major B read row by row: vg_pack_b_rows_span); empty: `pack_b` per sliver.
    pack_b_span: str = ""
    # B is the same on every call and every batch entry (`ContractionKernel.prepacked_b`): the
    # entry takes `char* vg_pre` (its slot of the arena's persistent region, `prepack.py`), packs
    # all of B there on the first call and never packs a panel again.
    prepack: bool = False
    # Cache blocks chosen per call (`CallBlocks`, over a symbolic M or K): each of MC, KC, NC that
    # differs between the pieces is rendered as the test of M (and K) that picks it (`_block`).
    call: CallBlocks | None = None


def _pieces(d: Driver, blk: Blocking) -> tuple[Blocking, ...]:
    return d.call.blocks if d.call is not None and len(d.call.blocks) > 1 else (blk,)


def _block(d: Driver, blk: Blocking, field: str) -> int | str:
    """MC, KC or NC: an int where every call has the same, else the C++ expression picking the
    call's piece by M (`CallBlocks.upto`). Each is a multiple of MR (MC) or NR (NC)."""
    values = [getattr(b, field) for b in _pieces(d, blk)]
    if len(set(values)) == 1:
        return values[0]
    assert d.call is not None
    if d.call.within:  # over a symbolic K: the first piece whose M and K limits the call fits
        tests = "".join(f"{_fits(d, w)} ? {v} : " for w, v in zip(d.call.within[:-1], values, strict=False))
        return f"({tests}{values[-1]})"
    tests = "".join(f"{d.m} <= {t} ? {v} : " for t, v in zip(d.call.upto, values, strict=False))
    return f"({tests}{values[-1]})"


def _fits(d: Driver, within: tuple[int | None, int | None]) -> str:
    """C++: the call's M and K within a piece's limits (`CallBlocks.within`)."""
    tests = [f"{size} <= {t}" for size, t in zip((d.m, d.k), within, strict=True) if t is not None]
    return f"({' && '.join(tests)})" if tests else "true"


def _workspace(d: Driver, blk: Blocking, epi: Epilogue) -> int | str:
    """Floats of fp32 partial-sum workspace (0: none, partial sums stay in C or never exist).
    A symbolic K always has one: whether it fits a KC block is the call's (comparing here took
    a guard, K <= the hint's KC, from the renderer)."""
    if epi.out_ctype == "float" or (isinstance(d.k, int) and all(b.kc >= d.k for b in _pieces(d, blk))):
        return 0
    panel = _ws_panel(d, blk)
    return d.m * panel if isinstance(panel, int) else f"{d.m} * {panel}"


def _ws_panel(d: Driver, blk: Blocking) -> int | str:
    """A workspace row's floats: a B panel's columns, at most N's rounded up (NC past a symbolic N
    is its cap, `schedule/blocks.py`: a call's panel is no wider than its N)."""
    panel = _panel(d, blk)
    return panel if isinstance(d.n, int) else f"vg_min({panel}, ({d.n} + {blk.nr - 1}) / {blk.nr} * {blk.nr})"


def _colsum_rows(d: Driver, blk: Blocking, epi: Epilogue) -> int:
    """Rows of column-sum partials: one per MR-row sliver of every batch entry (0: no column sums)."""
    if not epi.colsum:
        return 0
    if epi.out_ctype != "float":
        raise ValueError(f"{d.name}: column sums need an fp32 C (scratch slot 2 holds no workspace then)")
    return d.batch * -(-d.m // blk.mr)


def _colsum_reduce(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """Sum the partials row by row into `colsum_out`: a fixed order, vectorized over columns."""
    rows = _colsum_rows(d, blk, epi)
    if not rows:
        return ""
    return f"""  {{
    float* __restrict vg_o = {epi.colsum_out};
#pragma omp simd
    for (long j = 0; j < {d.n}; ++j) vg_o[j] = vg_cs[j];
    for (long t = 1; t < {rows}; ++t) {{
#pragma omp simd
      for (long j = 0; j < {d.n}; ++j) vg_o[j] += vg_cs[t * {d.n} + j];
    }}
  }}
"""


def _colsum_parts(d: Driver, blk: Blocking, epi: Epilogue) -> tuple[str, str, str, str]:
    """The writeback's column-sum pieces: (parameter, tile accumulator, per-element add, store of
    the tile's sums at its sliver's partials row on the last K block); empty without colsum."""
    if not _colsum_rows(d, blk, epi):
        return "", "", "", ""
    row0 = f"(bi * {-(-d.m // blk.mr)} + i0 / {blk.mr}) * {d.n} + j0"
    store = f"""  if (last) {{
    float* __restrict dst = vg_cs + {row0};
#pragma omp simd
    for (int q = 0; q < ncols; ++q) dst[q] = vg_acc[q];
  }}
"""
    acc = f"  alignas(64) float vg_acc[{blk.nr}] = {{}};\n"
    return ", float* __restrict vg_cs", acc, f"      vg_acc[q] += {epi.colsum};\n", store


def _one_k_block(d: Driver, blk: Blocking) -> bool:
    """K fits one KC block (fixed sizes): every tile is the first and the last of its K loop, so
    the writebacks that add a previous partial sum are dead code. Not rendering them saves g++
    a quarter of a GEMM's optimization time (compile time, docs/perf-log.md)."""
    return isinstance(d.k, int) and all(d.k <= b.kc for b in _pieces(d, blk))


def _full_slivers(d: Driver, blk: Blocking) -> bool:
    """Every NR-column sliver is whole (fixed N, a multiple of NR, panels of whole slivers): the
    edge-sliver writebacks are dead code."""
    return isinstance(d.n, int) and d.n % blk.nr == 0 and all(b.nc % blk.nr == 0 for b in _pieces(d, blk))


def _rows_first(d: Driver, blk: Blocking) -> str:
    """The schedule's `CallBlocks.rows_first` as C++: one row block per thread where M fits one."""
    if d.call is None or not d.call.rows_first:
        return ""
    return f"  if (mb < nth && ({d.m} + {blk.mr - 1}) / {blk.mr} >= nth) mb = nth;  // rows first (schedule)\n"


def _own_value(d: Driver, blk: Blocking) -> str:
    """`own` (one MC block: `_own_slivers`) as C++: a literal when M is fixed, so the renderer
    emits only the B packing path that runs. mb starts at ceil(M / MC) and only grows when it is
    more than 1, so `mb == 1` holds exactly when M fits one MC block, for every thread count."""
    if d.prepack:
        return "false"
    if not isinstance(d.m, int):
        return "mb == 1"
    ones = {-(-d.m // (-(-b.mc // b.mr) * b.mr)) == 1 for b in _pieces(d, blk)}
    if len(ones) > 1:  # pieces over a symbolic K with other MCs
        return "mb == 1"
    return "true" if ones == {True} else "false"


def _panel(d: Driver, blk: Blocking) -> int | str:
    """Columns of one packed B panel (NC rounded up to whole slivers; per call, NC's expression:
    `choose_blocking`'s NC is whole slivers)."""
    nc = _block(d, blk, "nc")
    return -(-nc // blk.nr) * blk.nr if isinstance(nc, int) else nc


def _writeback(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """NAME_wb<FULL, FIRST>: tile buffer -> C, adding the old partial sum; epilogue on the last K block."""
    nr_expr = f"(FULL ? {blk.nr} : nr)"
    ws = _workspace(d, blk, epi)
    wparam = ", float* __restrict vg_pw" if ws else ""
    wrow = f"    float* __restrict prow = vg_pw + r * {_ws_panel(d, blk)};\n" if ws else ""
    # Where partial sums live: C for fp32, the workspace otherwise; none when K fits one block.
    part = "prow" if ws else ("crow" if epi.out_ctype == "float" else "")
    partial = f"""    if (!last) {{
#pragma omp simd
      for (int q = 0; q < ncols; ++q) {part}[q] = FIRST ? trow[q] : {part}[q] + trow[q];
      continue;
    }}
"""
    first = f"FIRST ? trow[q] : {part}[q] + trow[q]" if part else "trow[q]"
    cparam, cinit, cadd, cstore = _colsum_parts(d, blk, epi)
    return f"""
template <bool FULL, bool FIRST>
static inline void {d.name}_wb(const float* __restrict t, {epi.out_ctype}* __restrict c_b{wparam}{cparam}, long co,
                               long bi, long i0, long j0, int mr, int nr, bool last{epi.params()}) {{
  (void)co; (void)bi; (void)last;
  const int ncols = {nr_expr};
{cinit}  for (int r = 0; r < mr; ++r) {{
    [[maybe_unused]] const long i = i0 + r;
{d.row_names}    {epi.out_ctype}* __restrict crow = c_b + i * {d.ldc} + j0;
{wrow}    const float* __restrict trow = t + r * {blk.nr};
{partial if part and not _one_k_block(d, blk) else ""}#pragma omp simd
    for (int q = 0; q < ncols; ++q) {{
      [[maybe_unused]] const long j = j0 + q;
      [[maybe_unused]] const long o = co + i * {d.ldc} + j;
{d.elem_names}      float v = {first};
{epi.code("      ")}      crow[q] = {epi.store};
{cadd}    }}
  }}
{cstore}}}
"""


def _tile_loop(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """The work-item loop: pack an A block, then jr (B slivers) x ir (A slivers) micro-kernel calls."""
    wb = f"{d.name}_wb"
    wp = f", vg_ws + (ic + ir) * {_ws_panel(d, blk)} + (j - jc)" if _workspace(d, blk, epi) else ""
    wp += ", vg_cs" if _colsum_rows(d, blk, epi) else ""
    call = f"(t, c_b{wp}, co, bi, ic + ir, j, mr, nr, last{epi.names()})"
    pack_a = d.pack_a or f"vg_pack_a<{blk.mr}, {blk.tw}>(a_b + ic * {d.lda} + pc, {d.lda}, mcur, kc, ap);"
    return f"""      for (long w = tid; w < items; w += nth) {{
        const long wb = w / nsplit, ic = wb * rs / mb * {blk.mr};
        const long mcur = vg_min((wb + 1) * rs / mb * {blk.mr}, {d.m}) - ic;
        const long s0 = (w % nsplit) * per, s1 = vg_min(nsl, s0 + per);
        if (mcur <= 0 || s0 >= s1) continue;
{_own_slivers(d, blk)}        {pack_a}
        for (long s = s0; s < s1; ++s) {{
          const long j = jc + s * {blk.nr};
          const int nr = static_cast<int>(vg_min({blk.nr}, {d.n} - j));
          for (long ir = 0; ir < mcur; ir += {blk.mr}) {{
            const int mr = static_cast<int>(vg_min({blk.mr}, mcur - ir));
            {microkernel_name(blk.mr, blk.nr, blk.lanes)}(kc, ap + ir * kc, bq + s * {blk.nr} * bstride, t);
{_wb_calls(d, blk, wb + "<{full}, {first}>" + call)}          }}
        }}
      }}
"""


def _wb_calls(d: Driver, blk: Blocking, call: str) -> str:
    """The writeback calls after a micro-kernel: by sliver width and first K block, each variant
    only where it can run (`_full_slivers`, `_one_k_block`)."""

    def by_first(full: str) -> str:
        if _one_k_block(d, blk):
            return call.format(full=full, first="true") + ";"
        return f"if (first) {call.format(full=full, first='true')}; else {call.format(full=full, first='false')};"

    pad = "            "
    if _full_slivers(d, blk):
        return f"{pad}{by_first('true')}\n"
    return (
        f"{pad}if (nr == {blk.nr}) {{\n{pad}  {by_first('true')}\n{pad}}} else {{\n"
        f"{pad}  {by_first('false')}\n{pad}}}\n"
    )


def _panel_step(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """One (jc, pc) step: pack the B panel (all threads, then a barrier), run the tiles, barrier
    before the panel is overwritten; prepacked, only the tiles on the panel already in place
    (a work item covers the same tiles in every K block, so no barrier is needed)."""
    if d.prepack:
        at = f"pc * {padded_n(d.n, blk.nr)} + jc * kc"
        head = f"      const float* __restrict bq = bp + {at};\n      const long bstride = kc;\n"
        return head + _tile_loop(d, blk, epi)
    if _own_value(d, blk) == "true":  # each thread packs its own slivers (`_own_slivers`)
        return f"""      const long bstride = {_block(d, blk, "kc")};
      const float* __restrict bq = bp;
{_tile_loop(d, blk, epi)}"""
    return f"""      const long bstride = own ? {_block(d, blk, "kc")} : kc;
      if (!own) {{
{_pack_slivers(d, blk, "nsl * tid / nth", "nsl * (tid + 1) / nth", "kc")}      }}
      if (coop && !own) {{
#pragma omp barrier
      }}
      const float* __restrict bq = bp;
{_tile_loop(d, blk, epi)}      if (coop && !own) {{
#pragma omp barrier
      }}
"""


def _own_slivers(d: Driver, blk: Blocking) -> str:
    """With one MC block every work item is a column chunk of its own, run by one thread: that
    thread packs the chunk's B slivers itself, so a K block needs no barrier (a weight gradient's
    small M with a long K had two per K block, and under load each waited on a preempted thread).
    Sliver s sits at s * NR * KC whatever this block's kc, so a thread still on its last K block
    never shares bytes with another's next one; a new column panel (jc) re-deals the slivers
    between threads, so the panel loop has one barrier there, and at each later batch entry's first
    panel (`_one`)."""
    if _own_value(d, blk) == "false":
        return ""
    return f"""        if (own) {{
{_pack_slivers(d, blk, "s0", "s1", _block(d, blk, "kc"))}        }}
"""


def _pack_slivers(d: Driver, blk: Blocking, lo: str, hi: str, stride: int | str) -> str:
    """Pack slivers [lo, hi) of the (jc, pc) panel, sliver s at bp + s * NR * stride: one span
    call where the kernel has one (`Driver.pack_b_span`), else sliver by sliver."""
    if d.pack_b_span:
        return f"""          {{
            const long sa = {lo}, sb = {hi}, sstride = {blk.nr} * {stride};
            {d.pack_b_span}
          }}
"""
    return f"""          for (long s = {lo}; s < {hi}; ++s) {{
            const long j = jc + s * {blk.nr}, nr = vg_min({blk.nr}, {d.n} - j);
            float* __restrict bps = bp + s * {blk.nr} * {stride};
            {d.pack_b}
          }}
"""


def _prepack(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """NAME_prepack: all of B (batch entry 0: B has no batch dims) in the prepacked layout."""
    return f"""
static void {d.name}_prepack(float* __restrict bp, long nth, {d.params}{epi.params()}) {{
  [[maybe_unused]] const long bi = 0;
  [[maybe_unused]] const float* __restrict b_b = B;
  const long nsl = ({d.n} + {blk.nr - 1}) / {blk.nr};
  for (long pc = 0; pc < {d.k}; pc += {blk.kc}) {{
    const long kc = vg_min({blk.kc}, {d.k} - pc);
#pragma omp parallel for num_threads(nth) schedule(static)
    for (long s = 0; s < nsl; ++s) {{
      const long j = s * {blk.nr}, nr = vg_min({blk.nr}, {d.n} - j);
      float* __restrict bps = bp + pc * {padded_n(d.n, blk.nr)} + j * kc;
      {d.pack_b}
    }}
  }}
}}
"""


def _redeal(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """C++: whether a thread's share of a panel may be another's in the next panel or batch entry
    and hold bytes both touch, so `_one` waits there: its own B slivers (`own`), or, with B
    prepacked (no panel barriers at all), its workspace partial sums where slivers are split
    between threads (nsplit > 1: with whole row blocks a thread keeps its rows in every panel)."""
    if d.prepack:
        return "nsplit > 1" if _workspace(d, blk, epi) else "false"
    return "own"


def _one(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """NAME_one: one batch entry, run by thread `tid` of `nth` (coop: all threads share `bp`)."""
    m, mr = d.m, blk.mr
    mc_max, kc, nc = _block(d, blk, "mc"), _block(d, blk, "kc"), _block(d, blk, "nc")
    if isinstance(mc_max, int):
        mc_max = -(-mc_max // mr) * mr  # no row block below is longer: mb >= m / mc_max
    ablock = mc_max * kc if isinstance(mc_max, int) and isinstance(kc, int) else f"{mc_max} * {kc}"
    ws = ", float* __restrict vg_ws" if _workspace(d, blk, epi) else ""
    ws += ", float* __restrict vg_cs" if _colsum_rows(d, blk, epi) else ""
    return f"""
static void {d.name}_one(long bi, long tid, long nth, bool coop, float* __restrict bp{ws}, {d.params}{epi.params()}) {{
{d.batch_setup}  float* __restrict ap = vg_scratch(0, {ablock});
  alignas(64) float t[{blk.mr * blk.nr}];
  // Work split: enough (MC block x column chunk) items for every thread, in equal numbers.
  long mb = ({m} + {mc_max} - 1) / {mc_max}, nsplit = 1;
{_rows_first(d, blk)}  if (mb < nth) nsplit = (nth + mb - 1) / mb;
  else mb = (mb + nth - 1) / nth * nth;
  // Row block wb holds MR-row slivers [wb * rs / mb, (wb + 1) * rs / mb): sizes differ by one
  // sliver at most, so with mb a multiple of the threads each thread gets the same rows (blocks of
  // MC rows and a short last one left one thread 17 % idle at 1024 rows, MC 112, two threads).
  const long rs = ({m} + {mr - 1}) / {mr};
  const long items = mb * nsplit;
  // One MC block: each thread's items are column chunks no other thread reads (_own_slivers).
  [[maybe_unused]] const bool own = {_own_value(d, blk)};
  for (long jc = 0; jc < {d.n}; jc += {nc}) {{
    // A new panel, or the next batch entry's first, re-deals the slivers: wait for every thread
    // to finish reading the last one (a short last panel dealt sliver 1 to thread 1; entry
    // bi + 1's first deals it to thread 0, which packed it while thread 1 still read it).
    if ({_redeal(d, blk, epi)} && coop && (jc > 0 || bi > 0)) {{
#pragma omp barrier
    }}
    const long nsl = (vg_min({nc}, {d.n} - jc) + {blk.nr - 1}) / {blk.nr};
    const long per = (nsl + nsplit - 1) / nsplit;
    for (long pc = 0; pc < {d.k}; pc += {kc}) {{
      const long kc = vg_min({kc}, {d.k} - pc);
      const bool first = pc == 0, last = pc + kc == {d.k};
{_panel_step(d, blk, epi)}    }}
  }}
}}
"""


def _entry(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    kc, panel = _block(d, blk, "kc"), _panel(d, blk)
    bsize = kc * panel if isinstance(kc, int) and isinstance(panel, int) else f"{kc} * {panel}"
    if not isinstance(d.n, int):  # NC past a symbolic N (its cap): the call's slivers only
        bsize = f"{kc} * {_ws_panel(d, blk)}"
    wsize = _workspace(d, blk, epi)
    panel = "bp" if d.prepack else f"vg_scratch(1, {bsize})"  # prepacked: all of B, in the arena
    private = panel + (f", vg_scratch(2, {wsize})" if wsize else "")
    shared = "bp" + (", vg_wsp" if wsize else "")
    alloc = f"float* vg_wsp = vg_scratch(2, {wsize});\n    " if wsize else ""
    crows = _colsum_rows(d, blk, epi)
    calloc = f"  float* const vg_cs = vg_scratch(2, {crows * d.n});\n" if crows else ""
    if crows:
        private, shared = private + ", vg_cs", shared + ", vg_cs"
    args = f"{d.args}{epi.names()}"
    pre, once = "", ""
    if d.prepack:
        pre = ", char* __restrict vg_pre"
        once = f"""  float* const bp = reinterpret_cast<float*>(vg_pre + {HEADER});
  if (vg_prepack_claim(reinterpret_cast<int*>(vg_pre))) {{
    {d.name}_prepack(bp, nth, {args});
    vg_prepack_done(reinterpret_cast<int*>(vg_pre));
  }}
"""
    return f"""
{d.linkage} void {d.name}({d.params}{epi.params()}{pre}, int nthreads) {{
  const long nth = nthreads > 0 ? nthreads : omp_get_max_threads();
{calloc}{once}  if (nth == 1) {{
    for (long bi = 0; bi < {d.batch}; ++bi) {d.name}_one(bi, 0, 1, false, {private}, {args});
  }} else if ({d.batch} > 1 && ({d.batch} % nth == 0 || {d.batch} >= 4 * nth)) {{
#pragma omp parallel for num_threads(nth) schedule(static)
    for (long bi = 0; bi < {d.batch}; ++bi) {d.name}_one(bi, 0, 1, false, {private}, {args});
  }} else {{
    {"" if d.prepack else f"float* bp = vg_scratch(1, {bsize});"}
    {alloc}#pragma omp parallel num_threads(nth)
    for (long bi = 0; bi < {d.batch}; ++bi)
      {d.name}_one(bi, omp_get_thread_num(), omp_get_num_threads(), true, {shared}, {args});
  }}
{_colsum_reduce(d, blk, epi)}}}
"""


def render_driver(d: Driver, blk: Blocking, epi: Epilogue) -> str:
    """Writeback, per-batch-entry loop nest (and the prepacker) and the entry function for one kernel."""
    pack = PREPACK_ONCE + _prepack(d, blk, epi) if d.prepack else ""
    return _writeback(d, blk, epi) + _one(d, blk, epi) + pack + _entry(d, blk, epi)
