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

from vfuse.codegen.cpp.function import kernel_function
from vfuse.codegen.cpp.rules import LOAD_CONVERT, STORAGE_TYPE, STORE_CONVERT
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.schedule import expr
from vfuse.schedule.expr import Var
from vfuse.schedule.kernel import Kernel, Load, Program, Stmt, Store, TransposeTiles


def transpose_helper(w: int) -> str:
    """`vf_transpose<W>`: dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols. Elements of
    4 bytes go in W x W blocks through vector registers: log2(W) rounds of interleaving row i with
    row i + W/2 transpose a block (vector extensions: g++ emits the tier's shuffles); the edges
    and other element sizes are copied one by one."""
    half = w // 2
    lo = ", ".join(f"{i}, {i + w}" for i in range(half))
    hi = ", ".join(f"{i + half}, {i + half + w}" for i in range(half))
    return f"""#ifndef VF_TRANSPOSE_{w}
#define VF_TRANSPOSE_{w}
template <typename T>
static inline void vf_transpose_{w}(const T* __restrict src, int64_t lds, T* __restrict dst, int64_t ldd,
                                  int64_t rows, int64_t cols) {{
  int64_t r0 = 0;
  if constexpr (sizeof(T) == 4) {{
    typedef uint32_t V __attribute__((vector_size({4 * w})));
    typedef int32_t M __attribute__((vector_size({4 * w})));
    const M lo = {{{lo}}}, hi = {{{hi}}};
    for (; r0 + {w} <= rows; r0 += {w}) {{
      int64_t c0 = 0;
      for (; c0 + {w} <= cols; c0 += {w}) {{
        V x[{w}], y[{w}];
        for (int i = 0; i < {w}; ++i) std::memcpy(&x[i], src + (r0 + i) * lds + c0, sizeof(V));
        for (int round = 0; (1 << round) < {w}; ++round) {{
          for (int i = 0; i < {half}; ++i) {{
            y[2 * i] = __builtin_shuffle(x[i], x[i + {half}], lo);
            y[2 * i + 1] = __builtin_shuffle(x[i], x[i + {half}], hi);
          }}
          for (int i = 0; i < {w}; ++i) x[i] = y[i];
        }}
        for (int i = 0; i < {w}; ++i) std::memcpy(dst + (c0 + i) * ldd + r0, &x[i], sizeof(V));
      }}
      for (; c0 < cols; ++c0)
        for (int i = 0; i < {w}; ++i) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
    }}
  }}
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r0] = src[r0 * lds + c];
}}
#endif"""


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
        names = dict(self.names)
        self.names.update({self.t.u: "ub", self.k.inner[-1].var: "vb"})
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
        _prefetch(w)
    _stage(w)
    w.open(f"for (int64_t {w.iu} = ub; {w.iu} < ue; ++{w.iu}) {{")
    if p.streamed:
        _streamed_row(w)
    else:
        w.w("#pragma omp simd")
        w.open(f"for (int64_t {w.iv} = vb; {w.iv} < ve; ++{w.iv}) {{")
        w.body(p, "_acc")
        w.close()
    w.close(3 + len(others))
    if p.streamed:
        w.w("vf_stream_fence();")
        if k.threaded:
            w.close()
    w.end_pass()


def _streamed_row(w: TransposeWriter) -> None:
    """One tile row: the body with its stores into L1 row buffers, then each copied out around
    the caches (`vf_stream`: whole lines non-temporal, a partial head or tail line plain)."""
    (p,) = w.k.passes
    stores = [s for s in p.body if isinstance(s, Store)]
    for j, s in enumerate(stores):
        w.w(f"alignas(64) {STORAGE_TYPE[s.dtype]} sb{j}[{w.t.cols}];")
    w.w("#pragma omp simd")
    w.open(f"for (int64_t {w.iv} = vb; {w.iv} < ve; ++{w.iv}) {{")
    for s in p.body:
        if isinstance(s, Store):
            w.w(f"sb{stores.index(s)}[{w.iv} - vb] = {STORE_CONVERT.get(s.dtype, '{0}').format(s.arg)};")
        else:
            w.stmt(s)
    w.close()
    for j, s in enumerate(stores):
        start = expr.render(s.index, {**w.names, w.k.inner[-1].var: "vb"})
        w.w(f"vf_stream(&{pointer(s.buf)}[{start}], sb{j}, (size_t)(ve - vb) * sizeof(sb{j}[0]));")


def _prefetch(w: TransposeWriter) -> None:
    """Into L2 (`Kernel.transpose.prefetch`): this tile's rows of the loads and stores contiguous
    along v (a line every 16 fp32), and the next tile's rows of the staged loads."""
    t, v = w.t, w.k.inner[-1]
    (p,) = w.k.passes
    line = 64
    for s in p.body:
        if not isinstance(s, Load | Store) or (isinstance(s, Load) and s.var in t.staged):
            continue
        if isinstance(s, Store) and p.streamed:
            continue  # a prefetch for writing reads the line: what streaming stores save
        step, row = line // s.dtype.itemsize, w.stride(s, t.u)
        if w.stride(s) == 1 and row:
            rw = 1 if isinstance(s, Store) else 0
            at = f"{w.origin(s)} + r * {row} + l"
            w.w(f"for (int64_t r = 0; r < ue - ub; ++r) for (int64_t l = 0; l < ve - vb; l += {step})")
            w.w(f"  __builtin_prefetch({at}, {rw}, 1);")
    for s in p.body:
        if isinstance(s, Load) and s.var in t.staged:
            step, at = line // s.dtype.itemsize, f"{w.origin(s)} + ({t.cols} + r) * {w.stride(s)} + l"
            w.w(f"for (int64_t r = 0; r < {t.cols} && vb + {t.cols} + r < {v.size}; ++r)")
            w.w(f"  for (int64_t l = 0; l < ue - ub; l += {step}) __builtin_prefetch({at}, 0, 1);")


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
