"""How each kernel is walked and vectorized: every choice a renderer acts on, as Kernel and Pass fields.

`decide(k, vector)` runs last in `build`, with `vector` the target's fp32 lanes per vector
instruction (`Target.simd_lanes`). It picks the kernel's `Walk` (one row, rows, row groups,
tiled columns, lookup table, tiled transposes: `transpose.py`), whether it forks threads, what
it prefetches (`prefetch.py`), and for each pass whether a loop is split between threads, how
its reductions accumulate (`Reduction`: plain SIMD, lanes or strips) and its row facts
(`rowfacts.py`). Renderers read these fields and decide nothing. Measurements behind the
constants: docs/perf-log.md.
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.ir import DType, Op, opdef
from vfuse.ir.sym import hint, is_sym
from vfuse.schedule.expr import Clamp, Lin, Var, walk
from vfuse.schedule.gates import SizeGate, both, either, size_choice
from vfuse.schedule.kernel import Accumulate, Compute, Kernel, Load, Loop, Pass, RandKey, Reduction, Store, Walk
from vfuse.schedule.moments import plan_moments
from vfuse.schedule.nest import STREAM_MIN_LLCS, stream_fixed, streamable_stores, with_stream_choice
from vfuse.schedule.peel import interior, threaded_selects
from vfuse.schedule.prefetch import SMALL_L2, plan_group_prefetch, plan_prefetch
from vfuse.schedule.rowfacts import affine_fmas, below_row_max, pass_invariant_divisors
from vfuse.schedule.transpose import plan_transpose, stream_tiles, with_tile_prefetches

BLOCK = 1024  # elements per partial sum: bounds the float rounding error of long sums
# Below this many elements a kernel runs on one thread (fork/join costs more than it saves).
PARALLEL_MIN = 32 * 1024
COLUMN_VECTORS = 4  # a column tile: 4 vectors of accumulators per reduction
LANE_VECTORS = 4  # lanes: 4 vectors of accumulators, 4 independent chains hide the add latency
ROW_GROUP = 4  # rows per group: enough independent chains to hide a pass's latency
# Rows this short are latency-bound passes at any vector width (4 x AVX-512's lanes; at AVX2,
# LayerNorm 8192x256 one thread 0.54 -> 0.42 ms in row groups: docs/perf-log.md).
ROW_GROUP_ELEMENTS = 256
CHAINS = 8  # strips over a row already in L1: 4-cycle FMA latency at two per cycle
FIRST_CHAINS = 4  # strips of a first pass over prefetched rows (8 gained nothing more)
# A first pass over rows not prefetched: accumulators of one 512-bit vector per step, the demand
# rate one AVX-512 chain has (more lost from DRAM on Zen 5); narrower vectors get that many chains
# (AVX2: 2, rms_silu 8192x1024 one thread 4.75 -> 4.2 ms; docs/perf-log.md).
UNPREFETCHED_FLOATS = 16
# Short rows in groups (LayerNorm 256 wide) stream their stores from half an LLC of loads and
# stores on small-L2 cores: Zen 3 (32 MiB L3, where a copy of 16 MiB ran at half its in-cache
# rate), one thread, streamed / cached kernel time: 8192 rows (16 MiB) 0.79, 16384 rows 0.81,
# 4096 rows (8 MiB, still cached) 1.12 (docs/perf-log.md, 2026-12-02).
GROUP_STREAM_LLCS = 0.5
# A streamed row pass stores from registers, this many fp32 lanes a non-temporal store, where its
# outputs are aligned: g++ builds an 8-lane loop as one ymm on every x86 tier and forwards it into
# the store (16 lanes may be two ymm, which one zmm load of the pair would stall on). The L1 chunk's
# store and reload cost softmax 8192x1024 12 %, one thread, Zen 3 (docs/perf-log.md, session 15).
STREAM_LANES = 8
# A few instructions per element, so the accumulator chain is what a pass waits on.
CHEAP = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.ABS, Op.MAXIMUM, Op.MINIMUM, Op.CAST, Op.WHERE})
# Inline arithmetic in the C++ prelude's fp32 forms (codegen/cpp/prelude.py): g++ vectorizes the
# strips' lane loop around them. A libm/libmvec call (log, sin, ...) stops outer-loop vectorization
# ("no vectype") and would leave the whole pass scalar. erf, GELU (ea170b7) and tanh (session 15) are inline.
INLINE = CHEAP | {Op.EXP, Op.DIV, Op.SQRT, Op.RSQRT, Op.SIGMOID, Op.SILU, Op.TANH, Op.ERF, Op.GELU}
FLOAT_ACC = frozenset({DType.F32, DType.F16, DType.BF16})  # accumulated in float
# Stored dtypes a flat lookup-table loop writes with byte shuffles (compute type = storage type).
SHUFFLED = (DType.I8, DType.U8, DType.BOOL, DType.F32, DType.I32)


def lanes(vector: int) -> int:
    """Accumulators of a LANES reduction for `vector` fp32 lanes per vector."""
    return LANE_VECTORS * vector


def decide(k: Kernel, vector: int, l1: int = 48 << 10, llc: int = 0, l2: int = 0) -> Kernel:
    """`k` with every rendering decision filled in, for vectors of `vector` fp32 lanes, `l1`
    bytes of L1 data cache and `l2` of L2 per core (0: unknown) and an `llc`-byte last-level
    cache (0: unknown)."""
    # Performance choices on sizes are taken at the hints of symbolic sizes (no guard: valid at any size).
    k = dataclasses.replace(k, **thread_choice(_total(k)), tile=column_tile(k, vector))
    k = dataclasses.replace(k, walk=_walk(k, vector))
    if k.walk is Walk.SINGLE_ROW and (tiles := plan_transpose(k, vector, l1)):
        # Streamed or not by the tiles' own rule (their traffic, not the stores' alone).
        k = dataclasses.replace(k, walk=Walk.TILED_TRANSPOSE, transpose=tiles, stream=False, stream_gate=None)
        k = with_tile_prefetches(with_stream_choice(k, stream_tiles(k, tiles, llc)), l2)
    if k.walk is Walk.ROW_GROUPS:
        k = dataclasses.replace(k, row_group=ROW_GROUP, prefetch=plan_group_prefetch(k, ROW_GROUP, l1))
        # Per call over a symbolic row count (the chunk loop's flag, codegen/cpp/streaming.py), the
        # 2-LLC gate of `nest.with_streaming` or this one: at the hint, a first call of 6145 rows left
        # 8192 unstreamed (the dynamic bench's layernorm_small).
        k = with_prefetched_streaming(k, stream_prefetched_rows(k, llc, l2, GROUP_STREAM_LLCS))
        k = dataclasses.replace(k, register_row=register_row(k, vector))
    elif k.walk is Walk.ROWS:
        k = dataclasses.replace(k, prefetch=plan_prefetch(k, l1, l2))
        k = with_prefetched_streaming(k, stream_prefetched_rows(k, llc, l2))
        # Not before a storing pass of transcendentals (ln_gelu 8192 x 1024: p10 0.95-1.0x, medians 1-2 % slower).
        cheap = all(_cheap_body(k, i) for i in range(2, len(k.passes)))
        k = dataclasses.replace(k, moments=plan_moments(k, vector, llc) if cheap else None)
    elif k.walk is Walk.LOOKUP_TABLE:
        # table.py streams a whole kernel or none of it: a per-call choice is taken at the hint.
        k = dataclasses.replace(stream_fixed(k), table_flat=table_flat(k))
    no_pre = clamped_loads(k)
    k = dataclasses.replace(k, no_pre=no_pre, no_jump_threading=threaded_selects(k), narrow_simd=no_pre and vector > 8)
    k = dataclasses.replace(k, row_stack=row_stack(k))
    return dataclasses.replace(k, passes=tuple(_pass(k, i, vector) for i in range(len(k.passes))))


def with_prefetched_streaming(k: Kernel, choice: bool | SizeGate) -> Kernel:
    """`k` also streaming where `stream_prefetched_rows` chose to (in a call: where either
    gate holds, `nest.with_streaming`'s or that one)."""
    if not k.stream:
        return with_stream_choice(k, choice)
    return k if k.stream_gate is None else with_stream_choice(k, either(k.stream_gate, choice))


def stream_prefetched_rows(k: Kernel, llc: int, l2: int, llcs: float = STREAM_MIN_LLCS) -> bool | SizeGate:
    """Whether a row walk with prefetched rows streams its stores although they are under
    `nest.with_streaming`'s STREAM_MIN_LLCS: on cores with a small L2 (`prefetch.SMALL_L2`, where
    it was measured), where its loads and stores together move that many LLCs (as tiled
    transposes, `transpose.stream_tiles`) and the storing pass is CHEAP (softmax's normalization:
    bound by memory, not by the chunk copy streaming adds); row groups from `llcs` = GROUP_STREAM_LLCS.
    Zen 3, softmax 8192x1024 (32 MiB in, 32 MiB out): 1.19x faster; LayerNorm+GELU 1.18x slower,
    RMSNorm+SiLU the same. Zen 5's
    streamed softmax had lost 10-30 % (nest.py), Zen 4's won with row prefetch (docs/perf-log.md).
    Over symbolic sizes, a gate where the bytes may end on either side (`nest.stream_choice`), and
    only in calls that prefetch where that is chosen per call (`RowPrefetch.gate`)."""
    small_l2 = 0 < l2 <= SMALL_L2
    stores = streamable_stores(k) if k.prefetch is not None and llc and small_l2 else []
    storing = [i for i, p in enumerate(k.passes) if any(isinstance(s, Store) for s in p.body)]
    if not stores or not all(_cheap_body(k, i) for i in storing):
        return False
    rows = [Var(lp.var) for lp in k.outer]
    moving = (s for p in k.passes for s in p.body if isinstance(s, Load) and any(s.index.coef(r) for r in rows))
    loads = {s.buf: s.dtype.itemsize for s in moving}  # not the weights every row reads again
    moved = size_choice(_total(k) * (sum(loads.values()) + sum(s.dtype.itemsize for s in stores)), int(llcs * llc))
    return both(moved, k.prefetch.gate or True) if k.prefetch is not None else moved


def _cheap_body(k: Kernel, i: int) -> bool:
    """Pass `i` computes only CHEAP ops per element, a division by a row scalar counting as the
    multiply it becomes (`Pass.recips`)."""
    recips = pass_invariant_divisors(k, i)
    ops = (s for s in k.passes[i].body if isinstance(s, Compute))
    return all(s.op in CHEAP or (s.op is Op.DIV and s.args[1] in recips) for s in ops)


def clamped_loads(k: Kernel) -> bool:
    """Whether a load's index clamps a strided walk of the SIMD loop (a stride-2 window tap at the
    border): see `Kernel.no_pre`. Stride-1 windows vectorize either way and run 6-8 % faster with
    PRE (3x3 average pool, measured), so they keep it."""
    loops = (*k.outer, *k.inner)
    simd = {lp.var for lp in loops if lp.vector} or {loops[-1].var} if loops else set()
    stmts = [*k.after, *(s for p in k.passes for s in (*p.before, *p.body))]
    clamps = [a for s in stmts if isinstance(s, Load) for lin in walk(s.index) for a, _ in lin.terms]
    return any(isinstance(a, Clamp) and any(abs(a.arg.coef(Var(v))) > 1 for v in simd) for a in clamps)


def row_stack(k: Kernel) -> int:
    """Stack bytes per row buffer (`Kernel.row_stack`) over a symbolic row length: ROW_STACK
    shared by the kernel's buffers, at most one BLOCK-element row each. Allocated per call,
    tiny_graph's ten 64-element buffers cost more than its 11 passes (aligned_alloc and free:
    1.25 -> 0.55 us per call, C harness; docs/perf-log.md, session 20). A constant size stays
    allocated: g++ drops the allocation where no parallel region shares the buffer."""
    count = sum(len(p.buffered) for p in k.passes)
    if not count or not any(is_sym(lp.size) for lp in k.inner):
        return 0
    return min(BLOCK * 8, ROW_STACK // count // 64 * 64)


def thread_choice(total: int) -> dict[str, object]:
    """Whether a kernel of `total` loop points forks threads: fixed where that holds or fails over
    the symbols' whole ranges, else threaded with a gate its calls test (`Kernel.thread_gate`):
    taken at the hint, a first call of a few rows left every later call on one thread."""
    choice = size_choice(total, PARALLEL_MIN)
    return {"threaded": choice is not False, "thread_gate": choice if isinstance(choice, SizeGate) else None}


def _total(k: Kernel) -> int:
    return math.prod(lp.size for lp in (*k.outer, *k.inner))


def _walk(k: Kernel, vector: int) -> Walk:
    if k.tile:
        return Walk.TILED_COLUMNS
    if k.table:
        return Walk.LOOKUP_TABLE
    if not k.outer:
        return Walk.SINGLE_ROW
    return Walk.ROW_GROUPS if use_row_groups(k, vector) else Walk.ROWS


def column_tile(k: Kernel, vector: int) -> int:
    """Tile width when the row's elements are strided but adjacent rows are contiguous (a
    reduction over a non-innermost axis): the reduced loops run outside and a tile of adjacent
    columns is the SIMD loop. Single-pass kernels without row buffers only; 0 otherwise."""
    if not k.outer or not k.inner or len(k.passes) != 1 or k.stream or k.table:
        return 0
    (p,) = k.passes
    if not p.reduces or p.buffered or any(opdef(r.op).returns_index for r in p.reduces):
        return 0
    loads = [s.index for s in (*p.before, *p.body) if isinstance(s, Load)]
    col, row = Var(k.outer[-1].var), Var(k.inner[-1].var)
    if any(e.coef(row) == 1 and not _row_scalar(e, col) for e in loads) or not any(e.coef(col) == 1 for e in loads):
        return 0
    return COLUMN_VECTORS * vector


def _row_scalar(index: Lin, col: Var) -> bool:
    """A load of one value per row, the same for every column (a LayerNorm's rstd in its weight
    gradient `sum(dY * (x - mean) * rstd, 0)`): a broadcast in the column tile, not a strided read.
    Such a load kept the kernel walking its rows' strided elements: 256 x 256, 2.5x eager's time."""
    return all(isinstance(a, Var) and a != col for a, _ in index.terms)


def use_row_groups(k: Kernel, vector: int) -> bool:
    """Short rows (up to ROW_GROUP_ELEMENTS or 4 x `lanes` elements, where latency rather than
    bandwidth bounds a pass) of a one-loop row nest. Row buffers are one row long and a RandKey
    is no plain value, so kernels with either keep the row-at-a-time walk. Streamed kernels too
    (row groups stream their stores: `decide`); before, 2 LLCs of stores (LayerNorm 65536x256)
    fell back to rows: one thread, groups / rows 0.91 (131072 rows 0.93; docs/perf-log.md)."""
    if len(k.outer) != 1 or k.tile or not any(p.reduces for p in k.passes):
        return False
    if any(is_sym(lp.size) for lp in k.inner):
        return False  # a row length known at run time only: the row-at-a-time walk serves every length
    if (
        math.prod(lp.size for lp in k.inner) > max(ROW_GROUP_ELEMENTS, 4 * lanes(vector))
        or hint(k.outer[0].size) < 2 * ROW_GROUP
    ):
        return False
    stmts = [*k.after, *(s for p in k.passes for s in p.before)]
    return not any(p.buffered or p.reloaded for p in k.passes) and not any(isinstance(s, RandKey) for s in stmts)


# fp32 ops a row held in registers computes as vector-extension operators (`register_row`).
REGISTER_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL})


def vector_registers(vector: int) -> int:
    """Vector registers of a target with `vector` fp32 lanes: 32 zmm at AVX-512's 16 lanes; 16 ymm
    at AVX2's 8; 16 at 4 lanes (SSE2's xmm; NEON's 32 q registers counted as 16)."""
    return 32 if vector >= 16 else 16


def register_row(k: Kernel, vector: int) -> int:
    """Lanes per vector (`Kernel.register_row`) where a row-group kernel's row is held in registers
    across its passes, one row at a time, 0 for the row-group walk: every row is loaded once, and a
    value a later pass computes again (LayerNorm's x - mean) is reused. Rows of whole vectors whose
    values live between passes take at most half the register file (the rest: accumulators and
    temporaries), and more than 2 x LANE_VECTORS of them: shorter rows' passes do not hide their
    chain of folds one row at a time, row groups interleave 4 rows. Passes of fp32 loads, stores,
    REGISTER_OPS and sums only, no streamed stores; the rows ahead prefetched as the groups' were.
    AVX-512, one thread, C harness, held / row groups: LayerNorm 256 wide (16 zmm) 0.90x in L2,
    0.72-0.77x at 8192 rows, RMSNorm 0.94x, 0.75-0.79x; LayerNorm 192 wide 1.0x, 0.8x; 128 wide
    1.03-1.08x, 0.92-0.98x; at AVX2 64 wide 1.14x, 256 wide (32 ymm) spilled 2.8x (docs/perf-log.md,
    session 21)."""
    if k.walk is not Walk.ROW_GROUPS or k.stream or k.stream_gate is not None or len(k.inner) != 1:
        return 0
    vec = k.inner[0]
    if is_sym(vec.size) or vec.size % vector:
        return 0
    count = vec.size // vector
    if count <= 2 * LANE_VECTORS:  # too short a row to hide its chain (folds, rsqrt) one row at a time
        return 0
    live = _carried_vectors(k, Var(vec.var))
    return vector if live is not None and live * count <= vector_registers(vector) // 2 else 0


def _carried_vectors(k: Kernel, v: Var) -> int | None:
    """The most row vectors live from one pass into a later one, a pass computing again a value an
    earlier one made reusing it; None where a pass holds what `register_row` does not render."""
    made: dict[str, int] = {}  # vector value -> the pass that made it
    used: dict[str, int] = {}  # vector value -> the last pass reading it
    for i, p in enumerate(k.passes):
        if p.buffered or p.reloaded or any(r.op is not Op.SUM or r.dtype is not DType.F32 for r in p.reduces):
            return None
        for s in p.body:
            if isinstance(s, Load | Store):
                if s.dtype is not DType.F32 or s.index.coef(v) not in ((1,) if isinstance(s, Store) else (0, 1)):
                    return None
                if any(not isinstance(a, Var) for a, _ in s.index.terms):
                    return None
            if isinstance(s, Store) or s.var in made:
                args = (s.arg,) if isinstance(s, Store) else ()
            elif isinstance(s, Load):
                args = ()
                if s.index.coef(v):
                    made[s.var] = i
            elif isinstance(s, Compute) and s.dtype is DType.F32 and s.op in REGISTER_OPS:
                args = s.args
                if any(a in made for a in args):
                    made[s.var] = i
            else:
                return None
            used.update({a: i for a in args if a in made})
        if any(r.arg not in made for r in p.reduces):
            return None
        used.update({r.arg: i for r in p.reduces})
    ends = [(made[x], used.get(x, made[x])) for x in made]
    return max((sum(a <= i < b for a, b in ends) for i in range(len(k.passes))), default=0)


def table_flat(k: Kernel) -> bool:
    """Whether a lookup-table kernel is contiguous bytes in -> contiguous outputs (one merged
    loop) of dtypes a byte shuffle writes, each stored as computed."""
    if k.outer or len(k.inner) != 1 or not k.passes[0].body:
        return False
    flat = Lin.var(Var(k.inner[0].var))
    (p,) = k.passes
    loads = [s for s in (*p.before, *p.body) if isinstance(s, Load)]
    stores = [s for s in p.body if isinstance(s, Store)]
    dtypes = {s.var: s.dtype for s in (*p.before, *p.body) if not isinstance(s, Store)}
    ok_load = all(s.index == flat or not s.index.terms for s in loads)  # scalars fill the table
    return ok_load and all(s.index == flat and s.dtype in SHUFFLED and dtypes[s.arg] is s.dtype for s in stores)


def _pass(k: Kernel, i: int, vector: int) -> Pass:
    p = k.passes[i]
    serial = bool(k.outer) or not k.threaded or any(opdef(r.op).returns_index for r in p.reduces)
    streamed = k.stream and any(isinstance(s, Store) for s in p.body)
    return dataclasses.replace(
        p,
        serial=serial,
        streamed=streamed,
        stream_lanes=(lanes_ := stream_lanes(k, p, streamed and serial, vector)),
        group_columns=group_columns(k, i, streamed, lanes_, vector),
        reduction=_reduction(k, p, serial, vector),
        recips=tuple(sorted(pass_invariant_divisors(k, i))),
        nonpos=tuple(sorted(below_row_max(k, p))),
        muladds=affine_fmas(k, i),
        peel=_peel(k, p, serial),
    )


def stream_lanes(k: Kernel, p: Pass, streamed: bool, vector: int) -> int:
    """Lanes per register store of a streamed, serial row pass (`Pass.stream_lanes`), 0 for the L1
    chunk only: fp32 stores contiguous along a SIMD loop of a constant multiple of that many."""
    n = min(vector, STREAM_LANES)
    if not streamed or not k.outer or not k.inner or is_sym(k.inner[-1].size) or k.inner[-1].size % n:
        return 0
    v = Var(k.inner[-1].var)
    stores = [s for s in p.body if isinstance(s, Store)]
    return n if all(s.dtype is DType.F32 and s.index.coef(v) == 1 for s in stores) else 0


def group_columns(k: Kernel, i: int, streamed: bool, lanes: int, vector: int) -> int:
    """Lanes per step of a row group's storing pass walked with the group's rows inside each step
    (`Pass.group_columns`), 0 for row by row: a pass streamed from registers, without reductions
    or divisions by row scalars, that reads a vector every row reads (LayerNorm's weight and bias:
    loaded once a group, not once a row). LayerNorm 8192x256, Zen 3, one thread, vs row by row
    streamed from registers: 0.96x (0.80x with the rows in L2). Cached stores (2048 rows) measured
    LayerNorm 0.95-0.98x, RMSNorm 1.07-1.17x under load: not taken (docs/perf-log.md, session 15)."""
    p, n = k.passes[i], min(vector, STREAM_LANES)
    if k.walk is not Walk.ROW_GROUPS or p.reduces or pass_invariant_divisors(k, i) or not (streamed and lanes):
        return 0
    if len(k.inner) != 1 or is_sym(k.inner[-1].size) or k.inner[-1].size % n:
        return 0
    row, v = Var(k.outer[0].var), Var(k.inner[0].var)
    shared = any(isinstance(s, Load) and not s.index.coef(row) and s.index.coef(v) for s in p.body)
    stores = [s for s in p.body if isinstance(s, Store)]
    return n if shared and stores and all(s.index.coef(v) == 1 for s in stores) else 0


def _peel(k: Kernel, p: Pass, serial: bool) -> tuple[int, int] | None:
    """A pointwise pass's SIMD loop split at a window's borders (`peel.py`); not when that loop is
    itself split between threads, or accumulates."""
    if not k.inner or p.reduces or p.streamed or (k.inner[-1].parallel and not serial):
        return None
    return interior(p, k.inner[-1])


def _reduction(k: Kernel, p: Pass, serial: bool, vector: int) -> Reduction:
    """How `p`'s reductions accumulate along the SIMD loop (the kernel's last inner loop)."""
    if not p.reduces:
        return Reduction()
    if not k.inner or any(opdef(r.op).returns_index for r in p.reduces):
        return Reduction(Accumulate.IN_ORDER)
    if k.walk is Walk.TILED_COLUMNS:
        return Reduction(Accumulate.SIMD, BLOCK)
    vec = k.inner[-1]
    parallel = vec.parallel and not serial
    n = lanes(vector)
    if use_lanes(p, vec, n):
        # A row that is one block: the folded lanes are the row's result. Combining them into
        # the identity (twice: block, then row) put two dependent adds on every row's chain.
        whole = len(k.inner) == 1 and not parallel and vec.size <= BLOCK
        return Reduction(Accumulate.LANES, BLOCK, lanes=n, whole_row=whole)
    if chains := strip_chains(k, p, vec, parallel, vector):
        return Reduction(Accumulate.STRIPS, BLOCK, chains=chains, vector=vector)
    if chains := run_time_chains(p, vec, vector):
        return Reduction(Accumulate.LANES, BLOCK, lanes=chains * vector, vector=vector)
    return Reduction(Accumulate.SIMD, BLOCK)


def run_time_chains(p: Pass, vec: Loop, vector: int) -> int:
    """Vectors of lanes for pass `p` over a row length known at run time only, 0 for the plain
    SIMD accumulation: groups of that many vectors, then whole vectors, then one masked vector
    (`Reduction.vector`), every step a lane loop of constant trip count (lanes and strips need
    the length). The plain SIMD loop over a run-time trip count ended each short row in a scalar
    remainder: tiny_graph's kernel on AVX-512, 11 passes, stack row buffers, 0.54 -> 0.47 us per
    call at 64, 0.67 -> 0.36 at 7, 2.2 -> 1.4 at 300 (static at 64: 0.39; docs/perf-log.md). CHEAP
    bodies get LANE_VECTORS chains where the length's hint spans two groups; others are bound by
    their own instructions (one chain: more measured the same at 64, 97 and 300)."""
    if not is_sym(vec.size) or any(r.tracks_nan for r in p.reduces) or narrow_access(p):
        return 0  # NaN-tracking max/min: a second chain g++ splits off (as `use_lanes`)
    chains = LANE_VECTORS if {s.op for s in p.body if isinstance(s, Compute)} <= CHEAP else 1
    while chains > 1 and min(hint(vec.size), BLOCK) < 2 * chains * vector:
        chains //= 2
    return chains


# Stack bytes for a kernel's row buffers over a symbolic row length (`row_stack`): small beside
# any thread's stack (OpenMP workers' included).
ROW_STACK = 64 << 10


# Bytes loaded or stored: a lane loop of `vector` fp32 lanes would need vectors of `vector`
# bytes, which x86 lacks; g++ then left the whole pass scalar ("no vectype": a ReLU mask read by
# train-mode BatchNorm's backward, 8x32x28x28 one thread 6.1 -> 0.5 ms as a plain SIMD loop).
NARROW = frozenset({DType.BOOL, DType.I8, DType.U8})


def narrow_access(p: Pass) -> bool:
    """Whether pass `p` loads or stores a one-byte dtype."""
    return any(isinstance(s, Load | Store) and s.dtype in NARROW for s in p.body)


def use_lanes(p: Pass, vec: Loop, n: int) -> bool:
    """Lanes pay off only while g++ unrolls the lane loop completely, which keeps the `n` lanes
    in registers: rows of 2 to 4 x n elements, and up to row groups' ROW_GROUP_ELEMENTS in at most
    8 steps of n (unrolled at AVX2's 256: LayerNorm 8192x256 two threads 0.194 -> 0.173 ms).
    Longer rows kept the lane array in memory and got slower, as did NaN-tracking max/min."""
    if is_sym(vec.size):
        return False  # lanes are unrolled for one length: a symbolic one takes the plain SIMD accumulation
    longest = max(4 * n, min(ROW_GROUP_ELEMENTS, 8 * n))
    return 2 * n <= vec.size <= longest and not any(r.tracks_nan for r in p.reduces)


def strip_chains(k: Kernel, p: Pass, vec: Loop, parallel: bool, vector: int) -> int:
    """Accumulator chains per lane for pass `p`, 0 for no strips: float sums and products of
    INLINE ops over blocks of one constant length of at least two vectors, not split between
    threads; a first pass over rows neither prefetched nor walked in groups only with cheap
    bodies and as many chains as make one 512-bit vector (more only piled up demand misses:
    none at AVX-512, 2 at AVX2). g++ vectorizes the
    lane loop only around a chain loop of constant trip count (a guard on it is "control flow
    in loop")."""
    if is_sym(vec.size):
        return 0  # strips need a constant trip count (as above)
    length = min(vec.size, BLOCK) if vec.size <= BLOCK or vec.size % BLOCK == 0 else None
    if parallel or length is None or length < 2 * vector:
        return 0
    ops = {s.op for s in p.body if isinstance(s, Compute)}
    if not ops <= INLINE or any(s.dtype is DType.F64 for s in p.body if isinstance(s, Compute)):
        return 0  # double math goes through libm
    if narrow_access(p):
        return 0
    if any(r.op not in (Op.SUM, Op.PROD) or r.dtype not in FLOAT_ACC for r in p.reduces):
        # Max/min track NaN in a flag: a second, independent chain that g++ splits off (not
        # vectorized: "two or more consecutive inner loops"), also when NaN rides in the value.
        return 0
    first = p is k.passes[0]
    unprefetched = first and k.prefetch is None and k.walk is not Walk.ROW_GROUPS
    if unprefetched and (not ops <= CHEAP or UNPREFETCHED_FLOATS // vector < 2):
        return 0
    # Bodies with other than CHEAP ops are bound by their own instructions: one chain each,
    # which still saves the serial horizontal sum.
    chains = (FIRST_CHAINS if first else CHAINS) if ops <= CHEAP else 1
    if unprefetched:
        chains = UNPREFETCHED_FLOATS // vector
    while chains > 1 and length < 2 * chains * vector:
        chains //= 2
    return chains
