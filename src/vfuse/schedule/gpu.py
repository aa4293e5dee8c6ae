"""GPU launch decisions: how each kernel is tiled and launched on a GPU target (`Kernel.gpu`).

`decide_gpu(kernel, target, numel)` runs in `build` for GPU targets (a100, h100, h200), after
the kernel's loops and passes are final. It picks the walk (`GpuWalk`): a pointwise nest is
FLAT (blocks of consecutive elements of the flattened nest); a reduction whose row is strided
but whose adjacent rows are contiguous (the `TILED_COLUMNS` fact) is COLUMNS (a tile of adjacent
columns per program, coalesced along them); every other reduction is ROWS (a few rows per
program). A row that fits `persistent_max` elements is one chunk kept in registers across
all passes; a longer one is walked in chunks once per pass. The Triton renderer
(`codegen/triton`) reads these fields and decides nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from vfuse.ir import Graph
from vfuse.schedule import expr
from vfuse.schedule.kernel import GpuLaunch, GpuWalk, Kernel, Load, Walk, stmt_index

INDEX_LIMIT = 2**31 - 1  # the largest int32 index; past it, index arithmetic needs 64 bits


@dataclass(frozen=True)
class GpuTable:
    """Starting points for one GPU preset, until an on-device autotuner measures them."""

    flat_block: int  # elements per program of a pointwise kernel
    persistent_max: int  # longest row a program keeps in registers for all its passes
    chunk: int  # elements per chunk of a longer row
    tile: int  # elements of one [rows, block] tile: short rows share a program
    columns: int  # adjacent columns per program of a column reduction
    warp_elements: int  # tile elements per warp (8 per thread)
    max_warps: int
    waves: int  # a row kernel keeps at least this many programs per SM (fewer rows per program)


# The three presets share one row: their register files (64K 32-bit registers per SM, 255 per
# thread) and warp sizes are equal, and what differs (the SM count) enters through Target.cores.
_SM80_SM90 = GpuTable(
    flat_block=1024, persistent_max=8192, chunk=2048, tile=4096, columns=64, warp_elements=256, max_warps=16, waves=2
)
TABLES: dict[str, GpuTable] = {"a100": _SM80_SM90, "h100": _SM80_SM90, "h200": _SM80_SM90}


def table_for(name: str) -> GpuTable:
    return TABLES.get(name, _SM80_SM90)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decide_gpu(k: Kernel, target: object, graph: Graph) -> Kernel:
    """`k` with its GPU launch decided for `target` (a GPU preset: its name picks the table,
    `cores` is its SM count); `graph` gives the buffers' sizes."""
    table = table_for(str(getattr(target, "name", "")))
    sms = int(getattr(target, "cores", 1))
    rows = math.prod(lp.size for lp in k.outer)
    row = math.prod(lp.size for lp in k.inner)
    if not k.outer and not any(p.reduces for p in k.passes):
        launch = _flat(row, table)
    elif k.walk is Walk.TILED_COLUMNS:
        launch = _columns(rows, row, table, sms)
    else:
        launch = _rows(rows, row, table, sms)
    # Flat indices of the padded grid (masked lanes too: one that wrapped would pass its mask).
    flats = [launch.programs * launch.block] if launch.walk is GpuWalk.FLAT else [launch.programs * launch.rows]
    if launch.walk is not GpuWalk.FLAT:
        flats.append(_cdiv(row, launch.block) * launch.block)
    wide = max(flats) - 1 > INDEX_LIMIT or _max_index(k, graph) > INDEX_LIMIT
    checks = min(table.flat_block, _pow2(max(graph[c.buf].tensor_type.numel for c in k.checks))) if k.checks else 0
    return dataclasses.replace(k, gpu=dataclasses.replace(launch, wide=wide, check_block=checks))


def _warps(elements: int, table: GpuTable) -> int:
    return max(1, min(_pow2(max(elements // table.warp_elements, 1)), table.max_warps))


def _flat(total: int, table: GpuTable) -> GpuLaunch:
    block = min(table.flat_block, _pow2(total))
    return GpuLaunch(GpuWalk.FLAT, block, 1, _cdiv(total, block), _warps(block, table))


def _rows(rows: int, row: int, table: GpuTable, sms: int) -> GpuLaunch:
    """Rows that fit `persistent_max` are one chunk; several short rows share a program while
    the grid keeps `waves` programs per SM."""
    persistent = row <= table.persistent_max
    block = _pow2(row) if persistent else table.chunk
    per = max(1, min(table.tile // block, _pow2(rows)))
    while per > 1 and _cdiv(rows, per) < table.waves * sms:
        per //= 2
    return GpuLaunch(GpuWalk.ROWS, block, per, _cdiv(rows, per), _warps(per * block, table), persistent)


def _columns(cols: int, row: int, table: GpuTable, sms: int) -> GpuLaunch:
    """A [block, columns] tile: adjacent columns are contiguous, so loads coalesce along them."""
    per = min(table.columns, _pow2(cols))
    while per > 16 and _cdiv(cols, per) < table.waves * sms:
        per //= 2
    block = max(1, min(_pow2(row), table.tile // per))
    return GpuLaunch(GpuWalk.COLUMNS, block, per, _cdiv(cols, per), _warps(per * block, table), row <= block)


def _max_index(k: Kernel, graph: Graph) -> int:
    """The largest element index any statement of `k` computes (a gather's: its buffer's size)."""
    sizes = {lp.var: lp.size for lp in (*k.outer, *k.inner)}
    stmts = [s for p in k.passes for s in (*p.before, *p.body, *p.reduces)] + list(k.after)
    top = 0
    for s in stmts:
        for e in stmt_index(s):
            hi = expr.span(e, sizes)[1]
            if expr.dyn_names(e) and isinstance(s, Load):
                hi = graph[s.buf].tensor_type.numel
            top = max(top, hi)
    return top
