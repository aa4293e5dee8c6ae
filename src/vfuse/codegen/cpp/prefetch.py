"""Software prefetch of a row kernel's next rows, as the schedule planned it (`Kernel.prefetch`,
`schedule/prefetch.py`): before each pass (row groups: in each pass's row loop), its share of the
lines of the row `distance` ahead. Over symbolic sizes the distance may be computed once per call
(PREFETCH_ROWS) and the prefetches taken only in calls whose sizes pass the plan's gate
(PREFETCH_FLAG: codegen/cpp/function.py writes both)."""

from __future__ import annotations

from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir.sym import is_sym
from vfuse.schedule import expr
from vfuse.schedule.kernel import RowPrefetch

PREFETCH_ROWS = "vf_pf_rows"  # a per-call distance (symbols are vf_s0, ...: no clash)
PREFETCH_FLAG = "vf_prefetched"  # whether this call prefetches


def render_prefetch(w: KernelWriter, pf: RowPrefetch, part: int, declare: bool = False) -> None:
    """Prefetch share `part` of row `i + distance` (the last row for the last few) of every
    planned buffer; the row ahead is defined at part 0, or where `declare` (a new scope)."""
    (lp,) = w.k.outer
    (vec,) = w.k.inner
    row = w.names[lp.var]
    ahead = PREFETCH_ROWS if is_sym(pf.distance) else pf.distance
    if part == 0 or declare:
        w.w(f"const int64_t {row}_pf = {row} + {ahead} < {lp.size} ? {row} + {ahead} : {lp.size - 1};")
    names = {**w.names, lp.var: f"{row}_pf", vec.var: "c"}
    gate = f"if ({PREFETCH_FLAG}) " if pf.gate is not None else ""
    for pl in pf.loads:
        lo, hi = pl.shares[part]
        if pl.live[part]:
            addr = f"{pointer(pl.load.buf)} + {expr.render(pl.load.index, names)}"
            loop = f"for (int64_t c = {lo}; c < {hi}; c += {pl.step})"
            w.w(f"{gate}{loop} __builtin_prefetch({addr}, 0, {pf.locality});")
