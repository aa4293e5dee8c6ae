"""Tiled transposes (`Walk.TILED_TRANSPOSE`; `schedule/transpose.py` decides which kernels):
pointwise nests whose operands disagree on the contiguous axis (`x.t() + y`, NCHW <-> NHWC).

The SIMD loop `v` and the loop `u` the staged accesses are contiguous along are walked in tiles
of `rows` x `cols` (`Kernel.transpose`), split between threads with the nest's other loops.
Per tile: each staged load's tile is copied into an L1 buffer in (u, v) order by `vf_transpose`
(read along u in runs of whole lines, transposed in `block` x `block` register blocks), then the
body runs over the tile with the SIMD loop reading that buffer contiguously. Every other access
is rendered as in the plain nest (its own index map: broadcasts, strides), so each element's
arithmetic is the plain nest's. A streamed kernel (`Pass.streamed`) writes each tile row of its
stores into an L1 row buffer and copies it out with `vf_stream` (non-temporal, as
`streaming.py`), then each thread fences once after its tiles.
"""

from __future__ import annotations

from collections.abc import Callable

from vfuse.codegen.cpp.function import kernel_function
from vfuse.codegen.cpp.rules import LOAD_CONVERT, STORAGE_TYPE, STORE_CONVERT
from vfuse.codegen.cpp.streaming import STREAM_FLAG, serial_copy
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.schedule import expr
from vfuse.schedule.expr import Var
from vfuse.schedule.kernel import LINE, Kernel, Load, Program, Stmt, Store, TransposeTiles


def transpose_helper(w: int) -> str:
    """`vf_transpose<W>`: dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols. Elements of
    4 bytes go in W x W blocks through vector registers (`block_rounds`); the edges and other element
    sizes are copied one by one. Rows are loaded and stored through a 4-byte-aligned vector type:
    g++ copies memcpy'd vectors into a stack array in 16-byte halves (znver tuning), then reloads
    them whole, a store-forwarding stall per row. The vectors hold T itself: as uint32 vectors (may_alias
    or not) g++ -O2 and up dropped the block stores into a float buffer where the tile's size was a
    constant (a symbolic kernel's copy for its hinted size: 11 rows read garbage; found by make fuzz,
    session 24)."""
    return f"""#ifndef VF_TRANSPOSE_{w}
#define VF_TRANSPOSE_{w}
template <typename T>
static inline void vf_transpose_{w}(const T* __restrict src, int64_t lds, T* __restrict dst, int64_t ldd,
                                  int64_t rows, int64_t cols) {{
  int64_t r0 = 0;
  if constexpr (sizeof(T) == 4) {{
    typedef T V __attribute__((vector_size({4 * w})));
    typedef T VU __attribute__((vector_size({4 * w}), aligned(4), may_alias));
    typedef int32_t M __attribute__((vector_size({4 * w})));
    for (; r0 + {w} <= rows; r0 += {w}) {{
      int64_t c0 = 0;
      for (; c0 + {w} <= cols; c0 += {w}) {{
        V x[{w}], y[{w}];
#pragma GCC unroll {w}
        for (int i = 0; i < {w}; ++i) x[i] = *(const VU*)(src + (r0 + i) * lds + c0);
{block_rounds(w)}
#pragma GCC unroll {w}
        for (int i = 0; i < {w}; ++i) *(VU*)(dst + (c0 + i) * ldd + r0) = x[i];
      }}
      for (; c0 < cols; ++c0)
        for (int i = 0; i < {w}; ++i) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
    }}
  }}
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r0] = src[r0 * lds + c];
}}
#endif"""


# The 8x8 block (`block_rounds`): x[i] holds row i on entry, column i on exit.
_ROUNDS_8 = """        const M i0 = {0, 8, 1, 9, 4, 12, 5, 13}, i1 = {2, 10, 3, 11, 6, 14, 7, 15};
        const M p0 = {0, 1, 8, 9, 4, 5, 12, 13}, p1 = {2, 3, 10, 11, 6, 7, 14, 15};
        const M h0 = {0, 1, 2, 3, 8, 9, 10, 11}, h1 = {4, 5, 6, 7, 12, 13, 14, 15};
#pragma GCC unroll 4
        for (int i = 0; i < 8; i += 2) {
          y[i] = __builtin_shuffle(x[i], x[i + 1], i0);  // rows i, i+1: columns 0 1 | 4 5
          y[i + 1] = __builtin_shuffle(x[i], x[i + 1], i1);  // columns 2 3 | 6 7
        }
#pragma GCC unroll 2
        for (int j = 0; j < 8; j += 4) {  // rows j..j+3: column c | c + 4
          x[j] = __builtin_shuffle(y[j], y[j + 2], p0);
          x[j + 1] = __builtin_shuffle(y[j], y[j + 2], p1);
          x[j + 2] = __builtin_shuffle(y[j + 1], y[j + 3], p0);
          x[j + 3] = __builtin_shuffle(y[j + 1], y[j + 3], p1);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {  // column i from rows 0..3 and 4..7; column i + 4
          y[i] = __builtin_shuffle(x[i], x[i + 4], h0);
          y[i + 4] = __builtin_shuffle(x[i], x[i + 4], h1);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) x[i] = y[i];"""


def block_rounds(w: int) -> str:
    """The block transpose of x[0..w) (via y), in shuffles each one instruction on the tier.

    w = 8 (AVX2, AVX-512 at 8 lanes): interleave adjacent rows within 128-bit halves (unpck),
    pair those (unpck of 64-bit elements), then swap 128-bit halves (vperm2i128 / vinserti128):
    24 shuffles. The generic rounds below (row i with row i + w/2, across the whole vector) need
    a two-source permute: one vpermt2d on AVX-512, but vperm2i128 + vpunpck on AVX2 (48 shuffles;
    with the row copies' stall, 1 ms of transpose_add's 5.6 per thread at 2048 x 4096). w = 4 (SSE, NEON):
    log2(w) rounds of interleaving row i with row i + w/2, each an unpck / zip."""
    if w == 8:
        return _ROUNDS_8
    half = w // 2
    lo = ", ".join(f"{i}, {i + w}" for i in range(half))
    hi = ", ".join(f"{i + half}, {i + half + w}" for i in range(half))
    return f"""        const M lo = {{{lo}}}, hi = {{{hi}}};
        for (int round = 0; (1 << round) < {w}; ++round) {{
          for (int i = 0; i < {half}; ++i) {{
            y[2 * i] = __builtin_shuffle(x[i], x[i + {half}], lo);
            y[2 * i + 1] = __builtin_shuffle(x[i], x[i + {half}], hi);
          }}
          for (int i = 0; i < {w}; ++i) x[i] = y[i];
        }}"""


class TransposeWriter(KernelWriter):
    """Renders staged loads from their tile buffer."""

    def __init__(self, kernel: Kernel, program: Program) -> None:
        super().__init__(kernel, program)
        assert kernel.transpose is not None
        self.t: TransposeTiles = kernel.transpose
        self.iu, self.iv = self.names[self.t.u], self.names[kernel.inner[-1].var]

    def at(self) -> str:
        return f"[({self.iu} - ub) * {self.t.cols} + ({self.iv} - vb)]"

    def value(self, s: Stmt) -> str:
        if isinstance(s, Load) and s.var in self.t.staged:
            return LOAD_CONVERT.get(s.dtype, "{0}").format(f"tb_{s.var}{self.at()}")
        return super().value(s)

    def origin(self, s: Load | Store) -> str:
        """The element of `s` at the tile's corner (u = ub, v = vb)."""
        return self.corner(s, "ub", "vb")

    def corner(self, s: Load | Store, u: str, v: str) -> str:
        """The element of `s` at u = `u`, v = `v` (C expressions)."""
        names = dict(self.names)
        self.names.update({self.t.u: u, self.k.inner[-1].var: v})
        try:
            return f"{pointer(s.buf)} + {self.idx(s.index)}"
        finally:
            self.names = names

    def stride(self, s: Load | Store, along: int | None = None) -> int:
        """The element stride of `s` along loop `along` (default: v)."""
        return s.index.coef(Var(self.k.inner[-1].var if along is None else along))


def render_transpose(k: Kernel, program: Program) -> str:
    assert k.transpose is not None
    w = TransposeWriter(k, program)
    return transpose_helper(k.transpose.block) + "\n\n" + kernel_function(w, _tiles)


def _tiles(w: TransposeWriter) -> None:
    k, t = w.k, w.t
    (p,) = k.passes
    *rest, vec = k.inner
    u = next(lp for lp in rest if lp.var == t.u)
    others = [lp for lp in rest if lp is not u]
    for s in p.before:
        w.stmt(s)
    w.begin_pass(p)
    collapse = f"schedule(static) collapse({len(others) + 2})"
    start = w.mark()
    if k.threaded and p.streamed:
        w.w("#pragma omp parallel num_threads(nt)")
        w.open("{")
        w.w(f"#pragma omp for {collapse} nowait")  # each thread fences its own stores after its tiles
    elif k.threaded:
        w.w(f"#pragma omp parallel for num_threads(nt) {collapse}")
    for lp in others:
        w.open_loop(lp)
    w.open(f"for (int64_t ub = 0; ub < {u.size}; ub += {t.rows}) {{")
    w.open(f"for (int64_t vb = 0; vb < {vec.size}; vb += {t.cols}) {{")
    w.w(f"const int64_t ue = ub + {t.rows} < {u.size} ? ub + {t.rows} : {u.size};")
    w.w(f"const int64_t ve = vb + {t.cols} < {vec.size} ? vb + {t.cols} : {vec.size};")
    if t.prefetch:
        _next_tile(w, u.size, vec.size)
    if t.prefetch and not t.spread:
        _prefetch_tile(w)
    _stage(w)
    w.open(f"for (int64_t {w.iu} = ub; {w.iu} < ue; ++{w.iu}) {{")
    if t.prefetch and t.spread:
        _prefetch_row(w)
    if p.streamed:
        _streamed_row(w)
    else:
        w.w("#pragma omp simd")
        w.open(f"for (int64_t {w.iv} = vb; {w.iv} < ve; ++{w.iv}) {{")
        w.body(p, "_acc")
        w.close()
    w.close(3 + len(others))
    if p.streamed:
        w.w(f"if ({STREAM_FLAG}) vf_stream_fence();" if k.stream_gate is not None else "vf_stream_fence();")
        if k.threaded:
            w.close()
    if k.threaded:  # threads chosen per call: a serial copy for one thread (`streaming.serial_copy`)
        serial_copy(w, start)
    w.end_pass()


def _streamed_row(w: TransposeWriter) -> None:
    """One tile row: the body with its stores into L1 row buffers, then each copied out around
    the caches (`vf_stream`: whole lines non-temporal, a partial head or tail line plain). Where
    the choice is per call (`Kernel.stream_gate`), one loop stores into the row buffers or
    straight into the outputs, as the call's STREAM_FLAG says (as `streaming.py`'s chunks)."""
    (p,) = w.k.passes
    stores = [s for s in p.body if isinstance(s, Store)]
    gated = w.k.stream_gate is not None
    starts = [f"&{pointer(s.buf)}[{expr.render(s.index, {**w.names, w.k.inner[-1].var: 'vb'})}]" for s in stores]
    for j, s in enumerate(stores):
        w.w(f"alignas(64) {STORAGE_TYPE[s.dtype]} sb{j}[{w.t.cols}];")
        if gated:
            w.w(f"{STORAGE_TYPE[s.dtype]}* const sd{j} = {STREAM_FLAG} ? sb{j} : {starts[j]};")
    w.w("#pragma omp simd")
    w.open(f"for (int64_t {w.iv} = vb; {w.iv} < ve; ++{w.iv}) {{")
    for s in p.body:
        if isinstance(s, Store):
            dst = f"{'sd' if gated else 'sb'}{stores.index(s)}"
            w.w(f"{dst}[{w.iv} - vb] = {STORE_CONVERT.get(s.dtype, '{0}').format(s.arg)};")
        else:
            w.stmt(s)
    w.close()
    if gated:
        w.open(f"if ({STREAM_FLAG}) {{")
    for j, start in enumerate(starts):
        w.w(f"vf_stream({start}, sb{j}, (size_t)(ve - vb) * sizeof(sb{j}[0]));")
    if gated:
        w.close()


def _next_tile(w: TransposeWriter, u_size: int, v_size: int) -> None:
    """The corner (un, vn) of the tile walked after this one (along v, then the next band of u)
    and its ends (une, vne); past the last band une <= un (nothing to prefetch)."""
    c, r = w.t.cols, w.t.rows
    w.w(f"const bool vf_wrap = vb + {c} >= {v_size};")
    w.w(f"const int64_t vn = vf_wrap ? 0 : vb + {c}, un = vf_wrap ? ub + {r} : ub;")
    w.w(f"const int64_t une = un + {r} < {u_size} ? un + {r} : {u_size};")
    w.w(f"const int64_t vne = vn + {c} < {v_size} ? vn + {c} : {v_size};")


def _prefetch_row(w: TransposeWriter) -> None:
    """Into L2 (`Kernel.transpose.prefetches`, as the schedule chose them), in tile row r: the next
    tile's row r of the loads and stores contiguous along v, and its share of the next tile's
    staged rows (runs along u). Spread over the rows, one tile ahead, so the misses overlap this
    tile's arithmetic. Each run is `run` elements long, even at a partial tile (prefetches never
    fault): with a run-time trip count (vne - vn) the same prefetches ran 1.4x slower
    (transpose_add, g++ 12, Zen 3)."""
    w.w(f"const int64_t r = {w.iu} - ub;")
    share = "(vne - vn) * {0} / (ue - ub)"
    runs = f"for (int64_t j = {share.format('r')}; j < {share.format('(r + 1)')}; ++j)"
    _prefetches(w, lambda c: f"if ({c + ' && ' if c else ''}un + r < une) ", runs)


def _prefetch_tile(w: TransposeWriter) -> None:
    """Into L2, at the tile's start (`TransposeTiles.spread` False): every row of the next tile
    of the loads and stores contiguous along v, and all its staged rows."""
    rows = "for (int64_t r = 0; r < une - un; ++r) "
    _prefetches(w, lambda c: (f"if ({c}) " if c else "") + rows, "for (int64_t j = 0; j < vne - vn; ++j)")


def _prefetches(w: TransposeWriter, rows: Callable[[str], str], runs: str) -> None:
    """The next tile's prefetches: row r of each access contiguous along v (inside `rows(c)`, a
    loop or a test of r, also testing `c` where not empty: a per-call streamed store's calls that
    do not stream), the staged loads' runs j (inside `runs`), each `run` elements long."""
    t = w.t
    for pf in t.prefetches:
        s = pf.access
        step = LINE // s.dtype.itemsize
        if isinstance(s, Load) and s.var in t.staged:
            at = f"{w.corner(s, 'un', 'vn')} + j * {w.stride(s)} + l"
            w.w(f"if (un < une) {runs}")
            w.w(f"  for (int64_t l = 0; l < {pf.run}; l += {step}) __builtin_prefetch({at}, 0, 1);")
            continue
        rw = 1 if isinstance(s, Store) else 0
        at = f"{w.corner(s, 'un', 'vn')} + r * {w.stride(s, t.u)} + l"
        unless = f"!{STREAM_FLAG}" if pf.unless_streamed else ""
        w.w(f"{rows(unless)}for (int64_t l = 0; l < {pf.run}; l += {step})")
        w.w(f"  __builtin_prefetch({at}, {rw}, 1);")


def _stage(w: TransposeWriter) -> None:
    """Each staged load's tile, transposed into its buffer: rows v (stride along v), columns u."""
    t = w.t
    (p,) = w.k.passes
    for s in p.body:
        if isinstance(s, Load) and s.var in t.staged:
            st = STORAGE_TYPE[s.dtype]
            w.w(f"alignas(64) {st} tb_{s.var}[{t.rows * t.cols}];")
            src, lds = w.origin(s), w.stride(s)
            w.w(f"vf_transpose_{t.block}<{st}>({src}, {lds}, tb_{s.var}, {t.cols}, ve - vb, ue - ub);")
