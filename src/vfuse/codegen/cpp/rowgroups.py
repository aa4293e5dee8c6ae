"""Short rows walked in groups: each pass runs over ROW_GROUP rows before the next pass starts.

A row kernel walks a row in several dependent passes (LayerNorm: mean, variance, normalize);
on a 1 KiB row each pass is a short chain of L3 loads, dependent adds and a horizontal sum
whose result the next pass waits for, so one row at a time leaves the core mostly idle.
Running pass 1 for ROW_GROUP consecutive rows, then pass 2 for the same rows, and so on,
hands the out-of-order core ROW_GROUP independent chains per pass. The per-row scalars a pass
produces (`before` values, reduction results) are kept in small arrays between passes,
constants are defined once per group; every row's arithmetic, and so its rounding, is
unchanged. Measurements, and what was tried and not kept: docs/perf-log.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from vfuse.codegen.cpp.lanes import LANES
from vfuse.codegen.cpp.rules import COMPUTE_TYPE
from vfuse.schedule.kernel import Const, Kernel, RandKey, Store

if TYPE_CHECKING:
    from vfuse.codegen.cpp.render import KernelWriter

ROW_GROUP = 4  # rows per group: enough independent chains to hide a pass's latency


def use_row_groups(k: Kernel) -> bool:
    """Short rows (up to 4 x LANES elements, where latency rather than bandwidth bounds a
    pass) of a one-loop row nest; row buffers are one row long and a RandKey is no plain
    value, so kernels with either keep the row-at-a-time walk."""
    if len(k.outer) != 1 or k.stream or k.tile or not any(p.reduces for p in k.passes):
        return False
    if math.prod(lp.size for lp in k.inner) > 4 * LANES or k.outer[0].size < 2 * ROW_GROUP:
        return False
    stmts = [*k.after, *(s for p in k.passes for s in p.before)]
    return not any(p.buffered or p.reloaded for p in k.passes) and not any(isinstance(s, RandKey) for s in stmts)


def render_row_groups(w: KernelWriter) -> None:
    """The row loop of `w.k` (opened here, after the omp-for pragma) in groups of ROW_GROUP."""
    (lp,) = w.k.outer
    row = w.names[lp.var]
    w.w(f"for (int64_t {row}_g = 0; {row}_g < {lp.size}; {row}_g += {ROW_GROUP}) {{")
    w.depth += 1
    if lp.size % ROW_GROUP:  # the last group is partial
        w.w(f"const int64_t {row}_n = {lp.size} - {row}_g < {ROW_GROUP} ? {lp.size} - {row}_g : {ROW_GROUP};")
    else:
        w.w(f"const int64_t {row}_n = {ROW_GROUP};")
    at = len(w.lines)
    # Constants are the same for every row: defined once here rather than carried through
    # the arrays, where g++ no longer sees them as constants (x / 256 became a division).
    consts = [s for p in w.k.passes for s in p.before if isinstance(s, Const)]
    for s in consts:
        w.stmt(s)
    carried: list[str] = []  # per-row scalars of earlier passes, in definition order
    for p in w.k.passes:
        _open_row(w, row, carried)
        w.pass_(replace(p, before=tuple(s for s in p.before if not isinstance(s, Const))))
        made = [s.var for s in p.before if not isinstance(s, Store | Const)] + [r.var for r in p.reduces]
        for v in made:
            w.w(f"{v}_rg[{row}_r] = {v};")
        carried += made
        w.close()
    if w.k.after:
        _open_row(w, row, carried)
        for s in w.k.after:
            w.stmt(s)
        w.close()
    # The arrays are declared now that the scalars' dtypes are known.
    decls = [f"{'  ' * w.depth}{COMPUTE_TYPE[w.dtypes[v]]} {v}_rg[{ROW_GROUP}];" for v in carried]
    w.lines[at:at] = decls
    w.close()


def _open_row(w: KernelWriter, row: str, carried: list[str]) -> None:
    """Open the loop over the group's rows and read back the scalars earlier passes made."""
    w.w(f"for (int64_t {row}_r = 0; {row}_r < {row}_n; ++{row}_r) {{")
    w.depth += 1
    w.w(f"const int64_t {row} = {row}_g + {row}_r;")
    for v in carried:
        w.w(f"const {COMPUTE_TYPE[w.dtypes[v]]} {v} = {v}_rg[{row}_r];")
