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

from vfuse.ir import DType, Graph, Op
from vfuse.schedule import expr
from vfuse.schedule.fp8dot import with_fp8_dot
from vfuse.schedule.gpu_types import ConvLayout
from vfuse.schedule.kernel import (
    Compute,
    ContractionKernel,
    GpuLaunch,
    GpuTiles,
    GpuWalk,
    Kernel,
    Load,
    Pass,
    Store,
    Walk,
    stmt_index,
)
from vfuse.schedule.lower import Unsupported
from vfuse.schedule.rowmerge import RowMerge, RowMethod

INDEX_LIMIT = 2**31 - 1  # the largest int32 index; past it, index arithmetic needs 64 bits


@dataclass(frozen=True)
class GpuTable:
    """Starting points for one GPU preset, until an on-device autotuner measures them."""

    flat_block: int  # elements per program of a pointwise kernel
    persistent_max: int  # longest row a program keeps in registers for all its passes
    chunk: int  # elements per chunk of a longer row
    tile: int  # elements of one [rows, block] tile: short rows share a program
    columns: int  # adjacent columns per program of a column reduction
    warp_elements: int  # fp32 tile elements per warp (8 per thread: 32 bytes); persistent rows of
    # narrower elements give a warp more of them (the same bytes per thread: `_row_bytes`)
    max_warps: int
    waves: int  # a row kernel keeps at least this many programs per SM (fewer rows per program)


# The three presets share one row: their register files (64K 32-bit registers per SM, 255 per
# thread) and warp sizes are equal, and what differs (the SM count) enters through Target.cores.
_SM80_SM90 = GpuTable(
    flat_block=1024, persistent_max=8192, chunk=2048, tile=4096, columns=64, warp_elements=256, max_warps=16, waves=2
)
TABLES: dict[str, GpuTable] = {"a100": _SM80_SM90, "h100": _SM80_SM90, "h200": _SM80_SM90}


# A persistent row re-tiled into a looped walk recomputes, in each pass, what the pass reads:
# cheap for LayerNorm / softmax (2-3 passes), quadratic for deep chains of row ops (split instead).
RETILE_LOOPED_PASSES = 3


def table_for(name: str, retile: int = 0) -> GpuTable:
    """The preset's table; `retile` > 0 for a kernel measured spilling that many times
    (`fusion/onchip.py`): each level halves the elements a thread holds at the same warps
    (more warps would lower the register cap per thread as much: 64K per SM): half the flat
    block, the row chunk, the persistent limit and the tile, half the elements per warp."""
    table = TABLES.get(name, _SM80_SM90)
    for _ in range(retile):
        t = table
        table = dataclasses.replace(
            t,
            flat_block=max(128, t.flat_block // 2),
            persistent_max=max(256, t.persistent_max // 2),
            chunk=max(256, t.chunk // 2),
            tile=max(256, t.tile // 2),
            warp_elements=max(32, t.warp_elements // 2),
        )
    return table


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decide_gpu(k: Kernel, target: object, graph: Graph, retile: int = 0) -> Kernel:
    """`k` with its GPU launch decided for `target` (a GPU preset: its name picks the table,
    `cores` is its SM count; `retile`: see `table_for`); `graph` gives the buffers' sizes."""
    table = table_for(str(getattr(target, "name", "")), retile)
    sms = int(getattr(target, "cores", 1))
    rows = math.prod(lp.size for lp in k.outer)
    row = math.prod(lp.size for lp in k.inner)
    if not k.outer and not any(p.reduces for p in k.passes):
        launch = _flat(row, table, _vector_elements(k))
    elif k.walk is Walk.TILED_COLUMNS:
        launch = _columns(rows, row, table, sms)
    else:
        # re-tiled: a persistent row stays one when looping would recompute too many passes
        keep = row <= table_for(str(getattr(target, "name", ""))).persistent_max
        keep = keep and retile > 0 and len(k.passes) > RETILE_LOOPED_PASSES
        launch = _rows(rows, row, table, sms, keep, _row_bytes(k))
    # Flat indices of the padded grid (masked lanes too: one that wrapped would pass its mask).
    flats = [launch.programs * launch.block] if launch.walk is GpuWalk.FLAT else [launch.programs * launch.rows]
    if launch.walk is not GpuWalk.FLAT:
        flats.append(_cdiv(row, launch.block) * launch.block)
    wide = max(flats) - 1 > INDEX_LIMIT or _max_index(k, graph) > INDEX_LIMIT
    checks = min(table.flat_block, _pow2(max(graph[c.buf].tensor_type.numel for c in k.checks))) if k.checks else 0
    merges = () if launch.walk is GpuWalk.FLAT or launch.persistent else row_merges(k)
    return dataclasses.replace(k, gpu=dataclasses.replace(launch, wide=wide, check_block=checks, merges=merges))


def _warps(elements: int, table: GpuTable, itemsize: int = 4) -> int:
    """Warps for a tile of `elements` of `itemsize` bytes: 32 bytes of it per thread (eight fp32,
    sixteen bf16: two 16-byte loads in flight per thread and operand, half the warps and shuffles
    of a row's reductions for bf16 than an element count would give)."""
    per_warp = table.warp_elements * 4 // max(1, min(itemsize, 4))
    return max(1, min(_pow2(max(elements // per_warp, 1)), table.max_warps))


def _row_bytes(k: Kernel) -> int:
    """The widest element (bytes, at most 4) a row kernel loads or stores along its row; 4
    when it has none (a row of constants or iotas). Persistent rows' warps are sized by it."""
    inner = {lp.var for lp in k.inner}
    sizes = [
        s.dtype.itemsize
        for p in k.passes
        for s in (*p.before, *p.body)
        if isinstance(s, Load | Store) and expr.var_ids(s.index) & inner
    ]
    return min(max(sizes, default=4), 4)


def _vector_elements(k: Kernel) -> int:
    """Elements of the narrowest dtype a kernel loads or stores in one 16-byte vector access."""
    sizes = [s.dtype.itemsize for p in k.passes for s in (*p.before, *p.body) if isinstance(s, Load | Store)]
    return 16 // max(1, min(min(sizes, default=4), 16))


def _flat(total: int, table: GpuTable, vector: int = 4) -> GpuLaunch:
    """Blocks of consecutive elements. Full blocks run mask-free (`unmasked`) where the count is
    a multiple of the block (no tail at all) or not of `vector` (the tail's mask would keep every
    program's accesses scalar); otherwise the mask is constant per vector already, and one masked
    body is half the code to compile."""
    block = min(table.flat_block, _pow2(total))
    programs = _cdiv(total, block)
    unmasked = total // block if total % block == 0 or total % vector else 0
    return GpuLaunch(GpuWalk.FLAT, block, 1, programs, _warps(block, table), unmasked=unmasked)


def _rows(rows: int, row: int, table: GpuTable, sms: int, persistent: bool = False, itemsize: int = 4) -> GpuLaunch:
    """Rows that fit `persistent_max` (or `persistent`) are one chunk; several short rows share
    a program while the grid keeps `waves` programs per SM."""
    persistent = persistent or row <= table.persistent_max
    block = _pow2(row) if persistent else table.chunk
    per = max(1, min(table.tile // block, _pow2(rows)))
    while per > 1 and _cdiv(rows, per) < table.waves * sms:
        per //= 2
    # Warps by bytes only for a persistent row: a looped one (and a column tile) keeps fp32 state
    # per lane whatever its input (Welford: 3 tiles; bf16 at 4 warps took 128 registers, not 62).
    warps = _warps(per * block, table, itemsize if persistent else 4)
    return GpuLaunch(GpuWalk.ROWS, block, per, _cdiv(rows, per), warps, persistent)


def _columns(cols: int, row: int, table: GpuTable, sms: int) -> GpuLaunch:
    """A [block, columns] tile: adjacent columns are contiguous, so loads coalesce along them."""
    per = min(table.columns, _pow2(cols))
    while per > 16 and _cdiv(cols, per) < table.waves * sms:
        per //= 2
    block = max(1, min(_pow2(row), table.tile // per))
    return GpuLaunch(GpuWalk.COLUMNS, block, per, _cdiv(cols, per), _warps(per * block, table), row <= block)


def row_merges(k: Kernel) -> tuple[RowMerge, ...]:
    """Pairs of passes of a looped row kernel whose two statistics one walk of the row gives:
    sum(x) then sum((x - c)^2) (WELFORD: mean and variance), max(x) then sum(exp(x - max))
    (ONLINE_SOFTMAX). Each walk saved is a read of the row from DRAM (or L2)."""
    defs = {s.var: s for p in k.passes for s in (*p.before, *p.body) if not isinstance(s, Store)}
    out: list[RowMerge] = []
    i = 0
    while i + 1 < len(k.passes):
        # per-row values known once pass i is done (the shift b subtracts must be one of them)
        rows = {s.var for p in k.passes[: i + 2] for s in p.before} | {
            r.var for p in k.passes[: i + 1] for r in p.reduces
        }
        m = _merge(i, k.passes[i], k.passes[i + 1], defs, rows)
        if m is not None:
            out.append(m)
        i += 2 if m is not None else 1
    return tuple(out)


def _merge(i: int, a: Pass, b: Pass, defs: dict[str, object], rows: set[str]) -> RowMerge | None:
    """Passes `a` (index `i`) and `b` as one walk, when `a` reduces one float value and `b`'s
    reductions are one of the two shapes above over `a`'s argument (`b` stores nothing)."""
    if len(a.reduces) != 1 or not b.reduces or any(isinstance(s, Store) for s in (*a.body, *b.body)):
        return None
    ra = a.reduces[0]
    if not ra.dtype.is_float or any(r.op is not Op.SUM or r.dtype != ra.arg_dtype for r in b.reduces):
        return None
    if ra.op is Op.SUM:
        return _welford(i, ra.arg, b, defs, rows)
    arg = _compute(defs, b.reduces[0].arg)
    if ra.op is Op.AMAX and len(b.reduces) == 1 and arg is not None and arg.op is Op.EXP:
        d = _compute(defs, arg.args[0])
        if d is not None and d.op is Op.SUB and d.args == (ra.arg, ra.var):
            return RowMerge(i, RowMethod.ONLINE_SOFTMAX, ra.arg, ra.var)
    return None


def _welford(i: int, x: str, b: Pass, defs: dict[str, object], rows: set[str]) -> RowMerge | None:
    """`b` sums (x - c)^2, and maybe x - c, with c a per-row value: WELFORD over `x`."""
    squares = [r for r in b.reduces if (m := _compute(defs, r.arg)) is not None and m.op is Op.MUL]
    if len(squares) != 1 or len(b.reduces) > 2:
        return None
    sq = _compute(defs, squares[0].arg)
    d = _compute(defs, sq.args[0]) if sq is not None and sq.args[0] == sq.args[1] else None
    if d is None or d.op is not Op.SUB or d.args[0] != x or d.args[1] not in rows:
        return None
    others = [r for r in b.reduces if r is not squares[0]]
    if any(r.arg != d.var for r in others):
        return None
    return RowMerge(i, RowMethod.WELFORD, x, d.args[1], others[0].var if others else None)


def _compute(defs: dict[str, object], var: str) -> Compute | None:
    s = defs.get(var)
    return s if isinstance(s, Compute) and s.dtype.is_float else None


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


# ---- contraction templates (codegen/triton/gemm.py, conv.py, attention.py) ----


@dataclass(frozen=True)
class TileRow:
    """One tiling of a contraction template: BLOCK_M, BLOCK_N, BLOCK_K (attention: head dims
    are whole), GROUP_M, warps, pipeline stages."""

    m: int
    n: int
    k: int
    group_m: int
    warps: int
    stages: int


@dataclass(frozen=True)
class ContractionTable:
    """Starting tiles per preset and operand width; the on-device autotuner
    (`codegen/triton/autotune.py`) times `candidates` around them and caches its choice."""

    gemm16: TileRow  # fp16 / bf16 operands: tensor cores (wgmma on sm_90, mma on sm_80)
    gemm32: TileRow  # fp32 operands: exact fp32 FMA, no TF32 (eager's default)
    attention16: TileRow
    attention32: TileRow
    smem: int  # shared memory per SM (bytes): no candidate may need more
    conv32: TileRow = TileRow(64, 64, 16, 8, 8, 3)  # fp32 implicit GEMM: its gathers' addresses take registers
    gemm8: TileRow | None = None  # fp8 operands (schedule/fp8dot.py); None: no fp8 tensor cores (sm_80)


# sm_90 (228 KB shared): 128x128x64 fp16 tiles over 3 stages use 96 KB, 8 warps (two warpgroups)
# for wgmma; sm_80 (164 KB): 4 stages of 128x128x32. fp32 runs on FMA (exact, no TF32): 64x64
# tiles 16 deep (32 deep spilled 96 bytes with a GELU epilogue, offline for sm_90); fp32
# attention 32 x 32 (64 x 32 spilled at head dim 64); fp32 conv over 8 warps (4 spilled 20
# bytes on a 3-channel 3x3 conv).
# fp8 (sm_89+): wgmma takes fp8 in K steps of 32; 128-deep tiles hold the same
# bytes as fp16's 64 (3 stages: 96 KB).
_SM90 = ContractionTable(
    TileRow(128, 128, 64, 8, 8, 3), TileRow(64, 64, 16, 8, 4, 3),
    TileRow(128, 64, 0, 1, 8, 2), TileRow(32, 32, 0, 1, 4, 2), 228 << 10,
    gemm8=TileRow(128, 128, 128, 8, 8, 3),
)  # fmt: skip
_SM80 = ContractionTable(
    TileRow(128, 128, 32, 8, 4, 4), TileRow(64, 64, 16, 8, 4, 3),
    TileRow(128, 64, 0, 1, 4, 2), TileRow(32, 32, 0, 1, 4, 2), 164 << 10,
)  # fmt: skip
CONTRACTION_TABLES: dict[str, ContractionTable] = {"a100": _SM80, "h100": _SM90, "h200": _SM90}
_DOT = {DType.F16: "fp16", DType.BF16: "bf16", DType.F32: "fp32"}
_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4}
MIN_DOT = 16  # tl.dot needs every tile dim >= 16
MIN_DOT_FP8 = 32


def contraction_table(name: str) -> ContractionTable:
    return CONTRACTION_TABLES.get(name, _SM90)


def fp8_cores(target: object) -> bool:
    """The GPU target has fp8 tensor cores (sm_89+), and Triton its e4m3 type."""
    return contraction_table(str(getattr(target, "name", ""))).gemm8 is not None


def dot_dtype(k: ContractionKernel, graph: Graph) -> str:
    """What tl.dot multiplies: the contraction's own dtype (a prologue's result is rounded to it)."""
    dtype = graph[k.node].tensor_type.dtype
    if dtype not in _DOT:
        raise Unsupported(f"%{k.node}: no Triton template for {dtype.value} contractions")
    return _DOT[dtype]


def gemm_dims(k: ContractionKernel) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a MATMUL (batch: the output's batch dims) or of a conv's implicit GEMM
    (batch: the conv groups; M: output pixels; N: output channels of a group)."""
    if k.op is Op.CONV2D:
        n, oc, oh, ow = k.out_shape
        cg, kh, kw = k.shapes[1][1:]
        groups = int(k.attrs["groups"])
        return groups, n * oh * ow, oc // groups, cg * kh * kw
    m, n = k.out_shape[-2:]
    return math.prod(k.out_shape[:-2]), m, n, k.shapes[0][-1]


def _clamp(block: int, size: int) -> int:
    return max(MIN_DOT, min(block, _pow2(size)))


def _smem(row: TileRow, dot: str, k: ContractionKernel) -> int:
    """Shared memory the pipelined operand tiles take (Triton's estimate: stages x (A + B tiles))."""
    if k.op is Op.SDPA:
        d = _pow2(k.shapes[0][-1]) + _pow2(k.shapes[2][-1])
        return row.stages * row.n * d * _BYTES[dot] + row.m * _pow2(k.shapes[0][-1]) * _BYTES[dot]
    return row.stages * (row.m + row.n) * row.k * _BYTES[dot]


def contraction_tiles(k: ContractionKernel, row: TileRow, dot: str, layout: ConvLayout | None = None) -> GpuTiles:
    """`row` fitted to `k`'s sizes: blocks no larger than the (power-of-two) dims, at least 16
    (`layout`: a conv's, see `conv_layout`; NHWC K steps shrink to divide the input channels)."""
    if k.op is Op.SDPA:
        q = k.shapes[0]
        lq, lk = q[-2], k.shapes[1][-2]
        bm, bn = _clamp(row.m, lq), _clamp(row.n, lk)
        programs = math.prod(q[:-2]) * _cdiv(lq, bm)
        return GpuTiles(bm, bn, 0, 1, row.warps, row.stages, programs, dot, _wide(k))
    batch, m, n, kk = gemm_dims(k)
    bm, bn, bk = _clamp(row.m, m), _clamp(row.n, n), _clamp(row.k, kk)
    if dot == "fp8":  # fp8 wgmma / mma take K in steps of 32 (a shorter K is masked)
        bk = max(bk, MIN_DOT_FP8)
    programs = batch * _cdiv(m, bm) * _cdiv(n, bn)
    taps = False
    if layout is ConvLayout.NHWC:
        step = _tap_step(k.shapes[1][1], row.k)
        bk, taps = (step, True) if step >= MIN_DOT else (bk, False)
    tiles = GpuTiles(bm, bn, bk, row.group_m, row.warps, row.stages, programs, dot, _wide(k))
    return dataclasses.replace(tiles, layout=layout, tap_steps=taps) if k.op is Op.CONV2D else tiles


def _tap_step(channels: int, block_k: int) -> int:
    """The largest power of two up to `block_k` dividing `channels` (a group's input channels)."""
    step = block_k
    while step > 1 and channels % step:
        step //= 2
    return step


def conv_layout(k: ContractionKernel, graph: Graph) -> ConvLayout:
    """NHWC when the conv's x and w are graph inputs or constants read as they are, and every
    conv reading them (transitively through shared operands) can read them so too: the runtime
    then binds them channels-last (a channels-last image and weight as given, others copied
    once per call, the weight OHWI), and no kernel reads them row-major. Otherwise NCHW."""
    node = graph[k.node]
    if tuple(k.operands[:2]) != tuple(node.inputs[:2]):
        return ConvLayout.NCHW
    if any(tuple(graph[v].tensor_type.shape) != tuple(s) for v, s in zip(k.operands[:2], k.shapes[:2], strict=True)):
        return ConvLayout.NCHW
    seen, stack = {k.node}, [k.node]
    while stack:  # the convs sharing an operand with this one, and theirs
        conv = graph[stack.pop()]
        for pos, v in enumerate(conv.inputs[:2]):
            if not _nhwc_operand(graph, v, pos):
                return ConvLayout.NCHW
            fresh = [u for u in graph.users(v) if u not in seen]
            seen.update(fresh)
            stack += fresh
    return ConvLayout.NHWC


def _nhwc_operand(graph: Graph, v: str, pos: int) -> bool:
    """`v` is a 4-D graph input or constant, not a graph output, read only by convs at `pos`."""
    n = graph[v]
    if n.op not in (Op.INPUT, Op.CONSTANT) or len(n.tensor_type.shape) != 4 or graph.is_output(v):
        return False
    return all(graph[u].op is Op.CONV2D and list(graph[u].inputs).index(v) == pos
               and graph[u].inputs.count(v) == 1 for u in graph.users(v))  # fmt: skip


def _wide(k: ContractionKernel) -> bool:
    sizes = [math.prod(s) for s in (*k.shapes, k.out_shape, k.space)]
    return max(sizes) - 1 > INDEX_LIMIT


def _row_for(k: ContractionKernel, table: ContractionTable, dot: str) -> TileRow:
    if dot == "fp8" and table.gemm8 is not None:
        return table.gemm8
    wide = dot != "fp32"
    if k.op is Op.SDPA:
        return table.attention16 if wide else table.attention32
    if k.op is Op.CONV2D and not wide:
        return table.conv32
    return table.gemm16 if wide else table.gemm32


def retiled_row(row: TileRow, retile: int) -> TileRow:
    """A template's tiling after `retile` measured spills: each level halves the larger of the
    output tile's sides (at least 16): half the accumulators and epilogue values per thread."""
    for _ in range(retile):
        if row.m >= row.n:
            row = dataclasses.replace(row, m=max(MIN_DOT, row.m // 2))
        else:
            row = dataclasses.replace(row, n=max(MIN_DOT, row.n // 2))
    return row


def decide_contraction(k: ContractionKernel, target: object, graph: Graph, retile: int = 0) -> ContractionKernel:
    """`k` with its Triton template's tiles for `target` (raises Unsupported where no template
    covers it: the contraction then runs through torch; `retile`: see `retiled_row`)."""
    if k.op not in (Op.MATMUL, Op.CONV2D, Op.SDPA):
        raise Unsupported(f"no Triton template for {k.op.value}")
    if k.op is Op.SDPA and max(k.shapes[0][-1], k.shapes[2][-1]) > 256:
        raise Unsupported(f"%{k.node}: head dim past 256 (the template keeps a row of Q and O in registers)")
    table = contraction_table(str(getattr(target, "name", "")))
    k = with_fp8_dot(k, graph, fp8_cores(target))
    dot = "fp8" if k.fp8 is not None else dot_dtype(k, graph)
    layout = conv_layout(k, graph) if k.op is Op.CONV2D else None
    return dataclasses.replace(k, gpu=contraction_tiles(k, retiled_row(_row_for(k, table, dot), retile), dot, layout))


_CANDIDATE_ROWS = (
    (64, 64, 32, 4, 3),
    (128, 64, 32, 4, 3),
    (64, 128, 32, 4, 3),
    (128, 128, 32, 8, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
)


def candidates(k: ContractionKernel, target: object) -> list[GpuTiles]:
    """Tilings the on-device autotuner times for `k` (its table row first), each within the
    preset's shared memory; duplicates after fitting to the sizes removed."""
    assert k.gpu is not None
    table = contraction_table(str(getattr(target, "name", "")))
    base = _row_for(k, table, k.gpu.dot)
    rows = [base]
    # Each candidate is a JIT compile (~1 s on the H200's host) before it is timed: the GPT-2 block's
    # three templates took 108-179 s over 16 candidates each. Eight: the usual Hopper tiles, pipeline
    # depth varied only where the tile is large enough for it to matter.
    for m, n, kk, w, stages in _CANDIDATE_ROWS:
        rows.append(TileRow(m, n, kk if k.op is not Op.SDPA else 0, base.group_m, w, stages))
    out: list[GpuTiles] = []
    for r in rows:
        if _smem(r, k.gpu.dot, k) > table.smem:
            continue
        t = contraction_tiles(k, r, k.gpu.dot, k.gpu.layout)
        if t not in out:
            out.append(t)
    return out
