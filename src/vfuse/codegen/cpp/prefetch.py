"""Software prefetch of a row kernel's next rows, as the schedule planned it (`Kernel.prefetch`,
`schedule/prefetch.py`): before each pass (row groups: in each pass's row loop), its share of the
lines of the row `distance` ahead."""

from __future__ import annotations

from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.schedule import expr
from vfuse.schedule.kernel import RowPrefetch


def render_prefetch(w: KernelWriter, pf: RowPrefetch, part: int, declare: bool = False) -> None:
    """Prefetch share `part` of row `i + distance` (the last row for the last few) of every
    planned buffer; the row ahead is defined at part 0, or where `declare` (a new scope)."""
    (lp,) = w.k.outer
    (vec,) = w.k.inner
    row = w.names[lp.var]
    if part == 0 or declare:
        w.w(f"const int64_t {row}_pf = {row} + {pf.distance} < {lp.size} ? {row} + {pf.distance} : {lp.size - 1};")
    names = {**w.names, lp.var: f"{row}_pf", vec.var: "c"}
    for pl in pf.loads:
        lo, hi = pl.shares[part]
        if lo < hi:
            addr = f"{pointer(pl.load.buf)} + {expr.render(pl.load.index, names)}"
            w.w(f"for (int64_t c = {lo}; c < {hi}; c += {pl.step}) __builtin_prefetch({addr}, 0, {pf.locality});")
