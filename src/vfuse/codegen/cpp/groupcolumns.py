"""A row group's storing pass with the group's rows inside each step of its SIMD loop
(`Pass.group_columns`): each step of `n` lanes computes that step of every row of the group, so a
vector every row reads (LayerNorm's weight and bias) is loaded once a group instead of once a row,
and a streamed pass stores each row's step from its register (`streaming.nt_stores`). A partial
last group, and where a streamed row is not aligned, take the row-by-row loop (`render_pass`).
The rows' arithmetic is the row-by-row loop's, statement by statement."""

from __future__ import annotations

from vfuse.codegen.cpp.passes import render_pass
from vfuse.codegen.cpp.rules import COMPUTE_TYPE, STORE_CONVERT
from vfuse.codegen.cpp.streaming import STREAM_FLAG, nt_stores
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.schedule import expr
from vfuse.schedule.kernel import Pass, Store


def render_group_columns(w: KernelWriter, p: Pass, carried: list[str]) -> None:
    """Pass `p` (its per-row statements already made and in `carried`'s arrays) over the group."""
    (lp,) = w.k.outer
    (vec,) = w.k.inner
    row, size, n = w.names[lp.var], w.k.row_group, p.group_columns
    stores = [s for s in p.body if isinstance(s, Store)]
    starts = [(r, s) for r in range(size) for s in stores]
    cond = f"{row}_n == {size}"
    if p.streamed:
        addr = " | ".join(f"(uintptr_t){_address(w, s, row, r, '0')}" for r, s in starts)
        cond += f" && (({addr}) & {4 * n - 1}) == 0"
        if w.k.stream_gate is not None:  # a call that does not stream stores row by row, cached
            cond += f" && {STREAM_FLAG}"
    w.open(f"if ({cond}) {{")
    w.begin_pass(p)
    w.open(f"for (int64_t vb = 0; vb < {vec.size}; vb += {n}) {{")
    w.w(f"const int64_t ve = vb + {n};")
    if p.streamed:
        w.w(f"alignas({4 * n}) float {', '.join(f'sb{r}_{j}[{n}]' for r in range(size) for j in range(len(stores)))};")
    w.w("#pragma omp simd")
    w.open_loop(vec, "vb", "ve")
    for r in range(size):
        _row_step(w, p, r, carried, stores)
    w.close()
    if p.streamed:
        pairs = [(_address(w, s, row, r, "vb"), f"sb{r}_{stores.index(s)}") for r, s in starts]
        for line in nt_stores(pairs, n):
            w.w(line)
    w.close()
    w.end_pass()
    w.close()
    w.open("else {")
    w.open(f"for (int64_t {row}_r = 0; {row}_r < {row}_n; ++{row}_r) {{")
    w.w(f"const int64_t {row} = {row}_g + {row}_r;")
    _carried(w, carried, f"{row}_r")
    render_pass(w, p)
    w.close(2)


def _row_step(w: KernelWriter, p: Pass, r: int, carried: list[str], stores: list[Store]) -> None:
    """Row `r` of the group at this lane: its own scope, so every row's values keep their names."""
    (lp,) = w.k.outer
    row = w.names[lp.var]
    w.open("{")
    w.w(f"const int64_t {row} = {row}_g + {r};")
    _carried(w, carried, str(r))
    for s in p.body:
        if isinstance(s, Store) and p.streamed:
            conv = STORE_CONVERT.get(s.dtype, "{0}").format(s.arg)
            w.w(f"sb{r}_{stores.index(s)}[{w.names[w.k.inner[0].var]} - vb] = {conv};")
        else:
            w.stmt(s)
    w.close()


def _carried(w: KernelWriter, carried: list[str], at: str) -> None:
    for v in carried:
        w.w(f"const {COMPUTE_TYPE[w.dtypes[v]]} {v} = {v}_rg[{at}];")


def _address(w: KernelWriter, s: Store, row: str, r: int, at: str) -> str:
    """`&out[index]` of store `s` for row `r` of the group at SIMD index `at`."""
    names = {**w.names, w.k.outer[0].var: f"({row}_g + {r})", w.k.inner[0].var: at}
    return f"&{pointer(s.buf)}[{expr.render(s.index, names)}]"
