"""The schedule's data: statements, loop nests, kernels, steps and the Program. A kernel body is a flat list
of SSA statements over index expressions (`expr.Lin`); the loop nest says how it is walked (parallel loops,
the SIMD loop, reductions split into passes over a row). Renderers only walk this."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from vfuse.ir import DType, Op
from vfuse.ir.types import TensorType
from vfuse.schedule.blocks import CallBlocks, ConvBlocks
from vfuse.schedule.dots import DotKind as DotKind  # re-exported: the schedule's types live here
from vfuse.schedule.dots import Fp8Dot, Int8Dot
from vfuse.schedule.expr import Lin, Range
from vfuse.schedule.gates import LINE as LINE  # re-exported: renderers read the schedule's data here
from vfuse.schedule.gates import PrefetchLoad as PrefetchLoad  # re-exported with RowPrefetch
from vfuse.schedule.gates import RowPrefetch, SizeGate
from vfuse.schedule.gates import TilePrefetch as TilePrefetch  # re-exported with TransposeTiles
from vfuse.schedule.gpu_types import GpuLaunch, GpuTiles
from vfuse.schedule.gpu_types import GpuWalk as GpuWalk  # re-exported: the schedule's types live here
from vfuse.targets.isa import Isa

NAN_TRACKED = (Op.AMAX, Op.AMIN)


class BufKind(enum.Enum):
    """Where a buffer a kernel touches comes from (decides how the entry point finds it)."""

    INPUT = "in"  # graph input, constant or torch-produced tensor: the segment's `in` array
    OUTPUT = "out"  # graph output: the segment's `out` array (a fresh tensor per call)
    ARENA = "arena"  # intermediate between kernels: offset into the arena
    SEED = "seed"  # an RNG_SEED value: the segment's `seeds` array


@dataclass(frozen=True, slots=True)
class Buffer:
    """An IR value held in memory, contiguous row-major in its IR type."""

    value: str
    type: TensorType
    kind: BufKind
    slot: int  # index into in/out/seeds, or the arena byte offset


class Place(enum.Enum):
    """Where an intermediate of a kernel lives."""

    REGISTER = "register"  # a scalar/vector local recomputed in each pass that needs it
    ROW_BUFFER = "row buffer"  # computed once per row, kept in a thread-local L1/L2 buffer
    MEMORY = "memory"  # stored to a Buffer (group outputs)


@dataclass(frozen=True, slots=True)
class Load:
    var: str
    dtype: DType
    buf: str  # Buffer.value
    index: Lin


@dataclass(frozen=True, slots=True)
class Const:
    var: str
    dtype: DType
    value: Any


@dataclass(frozen=True, slots=True)
class Compute:
    var: str
    dtype: DType
    op: Op
    args: tuple[str, ...]
    arg_dtypes: tuple[DType, ...]
    attrs: Any  # ir.Attrs


@dataclass(frozen=True, slots=True)
class Iota:
    var: str
    dtype: DType
    index: Lin
    start: Any
    step: Any


@dataclass(frozen=True, slots=True)
class RandKey:
    """The two 32-bit keys of (seed, stream), computed once per kernel rather than per element."""

    var: str
    seed: str  # var holding the i64 seed
    stream: int


@dataclass(frozen=True, slots=True)
class Rand:
    var: str
    key: str  # a RandKey var
    index: Lin  # the element counter (flat index in the RAND node's shape)


@dataclass(frozen=True, slots=True)
class Select:
    """CAT: args[k] where `coord` < bounds[k] first holds (the last arg otherwise)."""

    var: str
    dtype: DType
    coord: Lin
    bounds: tuple[int, ...]
    args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reduce:
    """An accumulator over the row (R loops) of a row kernel; `var` is valid after its pass."""

    var: str
    dtype: DType
    op: Op
    arg: str
    arg_dtype: DType
    rindex: Lin  # linear index inside the reduced space (ARGMAX/ARGMIN)

    @property
    def tracks_nan(self) -> bool:
        """A float max/min, whose result is NaN when any element is (as torch's): comparisons
        drop NaN, so its accumulator keeps a NaN flag beside a plain vector max/min."""
        return self.op in NAN_TRACKED and self.dtype.is_float


@dataclass(frozen=True, slots=True)
class Store:
    buf: str
    index: Lin
    arg: str
    dtype: DType


Stmt = Load | Const | Compute | Iota | RandKey | Rand | Select | Reduce


def stmt_args(s: Stmt) -> tuple[str, ...]:
    if isinstance(s, Compute | Select):
        return s.args
    if isinstance(s, Reduce):
        return (s.arg,)
    if isinstance(s, RandKey):
        return (s.seed,)
    if isinstance(s, Rand):
        return (s.key,)
    return ()


def stmt_index(s: Stmt | Store) -> tuple[Lin, ...]:
    if isinstance(s, Load | Iota | Rand | Store):
        return (s.index,)
    if isinstance(s, Select):
        return (s.coord,)
    if isinstance(s, Reduce):
        return (s.rindex,)
    return ()


@dataclass(frozen=True)
class Loop:
    """One loop of a nest: variable id, extent, and its role."""

    var: int
    size: int
    parallel: bool = False
    vector: bool = False


class Walk(enum.Enum):
    """How a kernel walks its loops; renderers are chosen by it (decided in `strategy.py`)."""

    SINGLE_ROW = "single row"  # no row loops: the whole nest is one row (pointwise kernels, full reductions)
    ROWS = "rows"  # row loops (parallel) around the passes over one row
    ROW_GROUPS = "row groups"  # each pass runs over `Kernel.row_group` rows before the next pass
    TILED_COLUMNS = "tiled columns"  # reduced loops outside, `Kernel.tile` adjacent columns as the SIMD loop
    LOOKUP_TABLE = "lookup table"  # results for all 256 values of `Kernel.table` tabulated, one lookup each
    TILED_TRANSPOSE = "tiled transpose"  # pointwise, operands contiguous along different loops: `Kernel.transpose`
    HORIZONTAL = "horizontal"  # independent pointwise nests (`Kernel.parts`) in one function (`horizontal.py`)


class Accumulate(enum.Enum):
    """How a pass's reductions accumulate along its SIMD loop."""

    NONE = "none"  # the pass reduces nothing
    IN_ORDER = "in order"  # element after element: an index reduction keeps the first winner
    SIMD = "simd"  # one vector accumulator per block
    LANES = "lanes"  # `lanes` accumulators per block (several vectors: independent add chains)
    STRIPS = "strips"  # an outer SIMD loop over `vector` lanes, `chains` accumulator chains in each


@dataclass(frozen=True)
class Reduction:
    """A pass's reduction strategy. Sums are blocked: each block of `block` elements is a
    partial result, which bounds the rounding error of long sums."""

    kind: Accumulate = Accumulate.NONE
    block: int = 0  # elements per partial result
    lanes: int = 0  # LANES: accumulators
    whole_row: bool = False  # LANES: the row is one block, its folded lanes are the row's result
    chains: int = 0  # STRIPS: accumulator chains per lane
    vector: int = 0  # STRIPS: lanes of the lane loop (one vector of fp32); LANES over a run-time length: see below
    # LANES with `vector` (a row length known at run time only): after the groups of `lanes`, whole
    # vectors of `vector` elements into the first lanes, then the last partial one masked.


@dataclass(frozen=True)
class Residue:
    """A pass's SIMD loop `var` walked as v = stride * q + b, b unrolled, and its enclosing loop `row` as
    row_stride * rvar + a, a branch per a (`bodies[a * stride + b]`, `pieces[j][...]`): `residue.py`."""

    var: int
    stride: int
    qvar: int
    groups: int
    bodies: tuple[tuple[Stmt | Store, ...], ...]
    pieces: tuple[tuple[Range, ...], ...]
    row: int = -1
    row_stride: int = 1
    rvar: int = -1


@dataclass(frozen=True)
class Pass:
    """A walk over the row: `before` once per row, `body` per element; after `reloaded`: decisions (`strategy.py`)."""

    before: tuple[Stmt, ...]
    body: tuple[Stmt | Store, ...]
    reduces: tuple[Reduce, ...]
    buffered: tuple[str, ...] = ()  # vars written to their row buffer in this pass
    reloaded: tuple[str, ...] = ()  # vars read back from their row buffer in this pass
    reduction: Reduction = Reduction()
    serial: bool = False  # no loop of this pass is split between threads
    streamed: bool = False  # the pass's stores bypass the caches (`Kernel.stream`)
    stream_lanes: int = 0  # streamed from registers, this many fp32 lanes a store, where aligned (`streaming.py`)
    group_columns: int = 0  # a full row group's rows inside each step of this many lanes (`rowgroups.py`)
    recips: tuple[str, ...] = ()  # divisors fixed for the pass: x / d is x * (1/d), 1/d computed before the loop
    nonpos: tuple[str, ...] = ()  # values known to be <= 0 or NaN (x - rowmax(x)): exp cannot overflow
    muladds: tuple[tuple[str, str, str, str], ...] = ()  # (var, a, b, c): var = a * b + c as one fma (`rowfacts.py`)
    peel: tuple[int, int] | None = None  # SIMD loop's [lo, hi) without active index clamps (`peel.py`)
    ranges: tuple[Range, ...] = ()  # the SIMD loop split where a CAT's selects switch (`peel.py`)
    residue: Residue | None = None  # the SIMD loop v split as stride * q + b, b unrolled (`residue.py`)


@dataclass(frozen=True)
class TransposeTiles:
    """`Walk.TILED_TRANSPOSE`: a pointwise nest whose SIMD loop `v` (the last) and loop `u` are
    walked in tiles of `rows` (along u) x `cols` (along v) elements. The loads `staged` are
    contiguous along `u`, strided along `v`: each tile of them is copied into an L1 buffer,
    transposed in `block` x `block` register blocks (codegen/cpp/transpose.py). Stores always
    follow the nest (a transposed output is computed from transposed loads)."""

    u: int  # loop var along which the staged accesses are contiguous
    rows: int  # tile extent along u
    cols: int  # tile extent along v
    block: int  # register transpose block (elements of 4 bytes per vector)
    staged: tuple[str, ...]  # Load vars read through a transposed tile buffer
    prefetch: bool = False  # into L2, one tile ahead: the next tile's rows of every load
    prefetches: tuple[TilePrefetch, ...] = ()  # what `prefetch` fetches (after the stream choice)
    spread: bool = True  # `prefetches` a share per tile row; False: all at the tile's start


@dataclass(frozen=True)
class IndexCheck:
    """A gather's whole index buffer, checked before the kernel's loops (codegen/cpp/faults.py):
    every index in [0, rows), or [-rows, rows) where negative ones wrap."""

    buf: str
    rows: int
    wrap: bool
    node: str  # the EMBEDDING node an out-of-range index is reported for


@dataclass(frozen=True)
class HintCopy:
    """`Kernel.at_hint`: the kernel scheduled with `sizes` (symbol name, hint) fixed, run by the
    calls where every such symbol equals its hint (`codegen/cpp/render.at_hint` tests them)."""

    sizes: tuple[tuple[str, int], ...]
    kernel: Kernel


@dataclass(frozen=True)
class Kernel:
    """One generated function. Pointwise: `outer` is the whole nest and `passes` has one pass
    whose body is the loop body. Row: `outer` are the row loops (parallel), `inner` the
    reduced loops walked once per pass; `after` runs once per row after the last pass."""

    name: str
    group: int
    label: str
    outer: tuple[Loop, ...]
    inner: tuple[Loop, ...]
    passes: tuple[Pass, ...]
    after: tuple[Stmt | Store, ...]
    buffers: tuple[str, ...]  # Buffer.value of everything read or written
    placement: dict[str, Place] = field(default_factory=dict)
    row_index: Lin = field(default_factory=Lin)  # linear index inside the row (row buffers)
    stream: bool = False  # stores bypass the caches (outputs larger than the LLC): see nest.with_streaming
    stream_gate: SizeGate | None = None  # over symbolic sizes, `stream` only where it holds (per call)
    table: str = ""  # the one byte-wide load the stores depend on: a lookup-table kernel (table.py)
    checks: tuple[IndexCheck, ...] = ()  # gather index buffers checked before the loops
    # How to render it, decided by `strategy.decide` from the kernel and the target's vector width.
    walk: Walk = Walk.SINGLE_ROW
    threaded: bool = False  # big enough to fork threads (else every loop runs on one)
    thread_gate: SizeGate | None = None  # over loop points: threads only from that many, per call
    tile: int = 0  # TILED_COLUMNS: columns reduced together (last outer loop)
    row_group: int = 0  # ROW_GROUPS: rows per group
    register_row: int = 0  # ROW_GROUPS: fp32 lanes a vector of a row held in registers, one row at a time
    moments: tuple[int, int] | None = None  # ROWS: (fp32 lanes, vectors a chunk): passes 0-1 as one (`moments.py`)
    prefetch: RowPrefetch | None = None  # ROWS: rows read ahead
    table_flat: bool = False  # LOOKUP_TABLE: contiguous bytes in and out, one flat loop
    transpose: TransposeTiles | None = None  # TILED_TRANSPOSE: the tiles and the accesses staged through L1
    gpu: GpuLaunch | None = None  # GPU targets: launch and tiling for the Triton renderer (`gpu.py`)
    # HORIZONTAL: the nests, each decided as if alone; `threaded` then says whether the parts that
    # are not threaded themselves are spread over the threads (`horizontal.py`).
    parts: tuple[Kernel, ...] = ()
    tail: int = 0  # HORIZONTAL: the last `tail` parts run after the others (they write inputs those read: inplace.py)
    # Loads at clamped indices (pooling windows, padding): g++'s partial-redundancy elimination merges
    # such loads across a window's taps into a form its vectorizer rejects (a 3x3 max-pool ran scalar,
    # 11x slower), so the function is compiled without it (`strategy.clamped_loads`).
    no_pre: bool = False
    # Loads at clamped indices whose selects test an outer loop's variable (a window's top and bottom
    # rows): g++'s jump threading splits the SIMD loop's body on those invariant tests, leaving the
    # loads conditional (masked strided loads it does not vectorize), so the function is compiled
    # without it (`peel.threaded_selects`).
    no_jump_threading: bool = False
    # Strided window taps (`no_pre`) on 16-lane targets: vectors of 8 lanes. A stride-2 tap's load is
    # two vectors and a permute, and a 28-wide row of 16 lanes runs mostly in the remainder: 3x3 s2
    # max-pools ran 1.5-2x slower in 512-bit vectors than in 256-bit ones on Zen 4.
    narrow_simd: bool = False
    # Over a symbolic row length: a copy scheduled at its hint, which calls of that length run
    # (constant trip counts: lanes, strips, row groups); others run this kernel (`rowhint.py`).
    at_hint: HintCopy | None = None
    # Over a symbolic row length: bytes of stack storage per row buffer; rows that fit use it, longer
    # ones allocate (`strategy.row_stack`). 0: allocated (g++ drops a constant-size one it sees unshared).
    row_stack: int = 0

    @property
    def is_row(self) -> bool:
        return bool(self.inner) or any(p.reduces for p in self.passes)


@dataclass(frozen=True)
class OperandPrologue:
    """A MATMUL operand computed while its panel is packed, not stored by a kernel first:
    `stmts` compute `result` (fp32), the operand's value at the element whose coordinate along
    dim d of the operand's shape is loop variable Var(d), from the buffers in `loads`. `inner`
    (-1 or -2) is the operand dim the packer walks innermost: the one its loads are contiguous
    along (Linear's transposed int8 weight is contiguous along K, its rows)."""

    stmts: tuple[Stmt, ...]
    result: str
    loads: tuple[str, ...]
    inner: int = -1


class ScatterWalk(enum.Enum):
    """How a SCATTER_ADD template walks (`schedule/contraction.scatter_walk`). Every output
    element adds its terms in the source's order in each walk; only who adds them differs."""

    SERIAL = "serial"  # one thread (too small to fork)
    PLANES = "planes"  # planes b split between threads, each plane's terms in order
    ROW_RANGES = "row ranges"  # each thread owns a range of output rows and reads every index


@dataclass(frozen=True)
class ContractionKernel:
    """One contraction (MATMUL / CONV2D / SDPA) rendered from a template, its pointwise epilogue
    fused: `epilogue` computes `result` from the accumulator `v` at the output element whose
    coordinate along dim d of the contraction's output is loop variable Var(d). Operands are
    buffers read row-major as `shapes` (a reshape of a buffer is the same bytes), except a
    MATMUL operand with a prologue: then `operands[i]` names the IR value the packer computes
    (no buffer) and its loads are among `extras`. `out` may have any dtype (the epilogue ends
    in a cast); the contraction itself accumulates in fp32."""

    name: str
    group: int
    label: str
    op: Op
    node: str  # the contraction IR node
    operands: tuple[str, ...]  # MATMUL: A, B; CONV2D: x, w; SDPA(_LSE): q, k, v[, mask]; SDPA_BACKWARD: ir/defs
    shapes: tuple[tuple[int, ...], ...]  # the shape each operand is read as
    out_shape: tuple[int, ...]  # the contraction node's shape
    space: tuple[int, ...]  # the epilogue's index space: `out`'s shape (a reshape of out_shape)
    out: str  # buffer written (the node itself, or the epilogue's last value)
    epilogue: tuple[Stmt, ...]
    result: str  # var holding the stored value ("v" without an epilogue)
    extras: tuple[str, ...]  # buffers the epilogue loads
    attrs: Any  # the node's ir.Attrs (conv geometry, SDPA scale / causal / gqa)
    trans_b: bool = False  # MATMUL: B is read as its transpose (nn.Linear's weight)
    caches: tuple[int, int, int] = (48 << 10, 1 << 20, 32 << 20)  # target L1/L2/L3 bytes
    prologues: tuple[OperandPrologue | None, ...] = ()  # MATMUL: per operand, computed while packing
    # The register tile (schedule/microtile.py) for the target's vector unit: fp32 lanes per vector
    # and mr x nr elements (GEMM / conv: rows x columns of C; attention: 4 x query rows of scores).
    vector: int = 16
    mr: int = 14
    nr: int = 32
    gpu: GpuTiles | None = None  # GPU targets: the Triton template's tiles (`schedule/gpu.py`)
    int8: Int8Dot | None = None  # MATMUL: dequantized int8 operands as an int32 dot product
    fp8: Fp8Dot | None = None  # GPU MATMUL: widened fp8 operands read as fp8, scales on the accumulator
    # MATMUL on CPU: B is a graph constant (a frozen weight, or computed from constants by its
    # prologue), packed into the micro-kernel's layout once, on the first call, into the arena's
    # persistent region (codegen/cpp/gemm/prepack.py) instead of on every call.
    prepacked_b: bool = False
    blocks: tuple[int, int] = (64, 64)  # attention: query rows x keys per tile (`microtile.attention_blocks`)
    scatter: ScatterWalk | None = None  # SCATTER_ADD: how its threads share the output
    stores: tuple[Store, ...] = ()  # GEMM on CPU: more outputs shaped like `out`, from the same tile
    colsum: Store | None = None  # GEMM on CPU: `buf` gets the column sums of var `arg` (schedule/colsum.py)
    gemm_blocks: CallBlocks | None = None  # MATMUL / CONV2D on CPU: cache blocks, per call over a symbolic M
    shared_a: bool = False  # MATMUL on CPU: all of A packed once per call before the driver (blocks.shared_a)
    conv_blocks: ConvBlocks | None = None  # CONV2D on CPU: direct path's channel blocks, folded passes' threads
    written = property(lambda self: (self.out, *(s.buf for s in (*self.stores, *filter(None, [self.colsum])))))

    def prologue(self, i: int) -> OperandPrologue | None:
        return self.prologues[i] if i < len(self.prologues) else None

    @property
    def direct(self) -> tuple[str, ...]:
        """The operands read straight from their buffers (those without a prologue)."""
        return tuple(v for i, v in enumerate(self.operands) if self.prologue(i) is None)

    @property
    def buffers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.direct, *self.extras, self.out, *self.written[1:])))


AnyKernel = Kernel | ContractionKernel


@dataclass(frozen=True)
class TorchStep:
    """Run these IR nodes through torch (OPAQUE ops, contractions, fallbacks), in order."""

    group: int
    label: str
    nodes: tuple[str, ...]
    reason: str
    packed: tuple[str, ...] = ()  # GEMMs whose constant weight is packed once (`schedule/packed.py`)


@dataclass(frozen=True)
class Segment:
    """Consecutive kernels run by one native call (`extern "C"` entry `name`)."""

    name: str
    kernels: tuple[AnyKernel, ...]
    inputs: tuple[str, ...]  # values passed in the `in` array, in slot order
    outputs: tuple[str, ...]  # values passed in the `out` array, in slot order


Step = Segment | TorchStep


@dataclass(frozen=True)
class MemoryPlan:
    """Arena layout: byte offset of every intermediate, and the arena size (64-byte aligned)."""

    offsets: dict[str, int]
    size: int
    naive_bytes: int  # what a buffer per value would take, to show the reuse


@dataclass(frozen=True)
class Program:
    """Everything a backend renders and the runtime runs for one compiled graph."""

    steps: tuple[Step, ...]
    buffers: dict[str, Buffer]
    memory: MemoryPlan
    seeds: tuple[str, ...]  # RNG_SEED values in `seeds` slot order
    vector_width: int  # fp32 lanes per vector the kernels were decided for (`Target.simd_lanes`)
    isa: Isa | None = None  # instruction-set tier the code is built for (`Target.isa`; None: this CPU's own)
    in_place: tuple[tuple[str, str], ...] = ()  # (output, graph input): stored into the input (`inplace.py`)
    # (output, donated graph input, byte offset): stored into the input's bytes after its last read (`donate.py`)
    donated: tuple[tuple[str, str, int], ...] = ()
    # (donor, byte offset) of the donors the forward returns in one block, and the block's bytes:
    # a `donated` offset may then run past its donor into the next ones (`donate.py`)
    donor_block: tuple[tuple[str, int], ...] = ()
    donor_block_bytes: int = 0
    # (output, arena byte offset): stored in the arena, which the outputs then keep (`donate.py`)
    arena_outputs: tuple[tuple[str, int], ...] = ()
    profiled: bool = False  # a timing build (`runtime/profile.py`): segments also get entries clocking each kernel
    symbols: tuple[str, ...] = ()  # symbolic sizes (ir/sym.py), read as `vf_<name>` after the RNG seeds

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.steps if isinstance(s, Segment))

    @property
    def kernels(self) -> tuple[AnyKernel, ...]:
        return tuple(k for s in self.segments for k in s.kernels)
