"""Short rows walked in groups (`Walk.ROW_GROUPS`): each pass runs over `Kernel.row_group` rows
before the next pass starts.

A row kernel walks a row in several dependent passes (LayerNorm: mean, variance, normalize);
on a short row each pass is a short chain of loads, dependent adds and a horizontal sum whose
result the next pass waits for, so one row at a time leaves the core mostly idle. Running pass
1 for a group of consecutive rows, then pass 2 for the same rows, and so on, hands the
out-of-order core independent chains per pass. The per-row scalars a pass produces (`before`
values, reduction results) are kept in small arrays between passes, constants are defined once
per group; every row's arithmetic, and so its rounding, is unchanged. The schedule decides
which kernels (`schedule/strategy.py`), and the rows each pass prefetches ahead
(`schedule/prefetch.plan_group_prefetch`).
"""

from __future__ import annotations

from dataclasses import replace

from vfuse.codegen.cpp.groupcolumns import render_group_columns
from vfuse.codegen.cpp.passes import render_pass
from vfuse.codegen.cpp.prefetch import render_prefetch
from vfuse.codegen.cpp.regrows import render_register_rows
from vfuse.codegen.cpp.rows import row_region
from vfuse.codegen.cpp.rules import COMPUTE_TYPE
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.ir.sym import known_multiple
from vfuse.schedule.kernel import Const, Store


def render_row_groups(w: KernelWriter) -> None:
    if w.k.register_row:  # one row at a time, held in registers (`regrows.py`)
        render_register_rows(w)
    else:
        row_region(w, _groups)


def _groups(w: KernelWriter) -> None:
    """The row loop of `w.k` (opened here, after the omp-for pragma) in groups."""
    (lp,) = w.k.outer
    size, row = w.k.row_group, w.names[lp.var]
    w.open(f"for (int64_t {row}_g = 0; {row}_g < {lp.size}; {row}_g += {size}) {{")
    if not known_multiple(lp.size, size):  # the last group is partial (or may be: a symbolic row count)
        w.w(f"const int64_t {row}_n = {lp.size} - {row}_g < {size} ? {lp.size} - {row}_g : {size};")
    else:
        w.w(f"const int64_t {row}_n = {size};")
    at = w.mark()
    # Constants are the same for every row: defined once here rather than carried through
    # the arrays, where g++ no longer sees them as constants (x / 256 became a division).
    for s in (s for p in w.k.passes for s in p.before if isinstance(s, Const)):
        w.stmt(s)
    carried: list[str] = []  # per-row scalars of earlier passes, in definition order
    for i, p in enumerate(w.k.passes):
        _open_row(w, row, carried)
        if w.k.prefetch:  # each pass's row loop: its share of the row `distance` ahead
            render_prefetch(w, w.k.prefetch, i, declare=True)
        before = tuple(s for s in p.before if not isinstance(s, Const))
        if p.group_columns:  # the per-row statements here, the loop over the row below
            for s in before:
                w.stmt(s)
        else:
            render_pass(w, replace(p, before=before))
        made = [s.var for s in p.before if not isinstance(s, Store | Const)] + [r.var for r in p.reduces]
        for v in made:
            w.w(f"{v}_rg[{row}_r] = {v};")
        carried += made
        w.close()
        if p.group_columns:
            render_group_columns(w, replace(p, before=()), carried)
    if w.k.after:
        _open_row(w, row, carried)
        for s in w.k.after:
            w.stmt(s)
        w.close()
    # The arrays are declared now that the scalars' dtypes are known.
    w.insert(at, [f"{COMPUTE_TYPE[w.dtypes[v]]} {v}_rg[{size}];" for v in carried])
    w.close()


def _open_row(w: KernelWriter, row: str, carried: list[str]) -> None:
    """Open the loop over the group's rows and read back the scalars earlier passes made."""
    w.open(f"for (int64_t {row}_r = 0; {row}_r < {row}_n; ++{row}_r) {{")
    w.w(f"const int64_t {row} = {row}_g + {row}_r;")
    for v in carried:
        w.w(f"const {COMPUTE_TYPE[w.dtypes[v]]} {v} = {v}_rg[{row}_r];")
