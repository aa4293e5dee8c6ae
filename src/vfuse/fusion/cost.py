"""The cost model: predicted time of one kernel (a candidate group) on a target.

    t = launch + (C + M - gamma * min(C, M)) / min(1, parallelism) + spill

C = contraction flops / matrix peak + other flops / vector peak; M = unique DRAM bytes /
DRAM bandwidth (on calibrated CPUs by size, and at least a column walk's strided misses:
`cost_columns`). gamma is how
much of the shorter of C and M hides under the longer: 0.8 on GPUs (many warps in flight per
SM hide memory latency behind arithmetic), 0.5 on CPUs (out-of-order execution and hardware
prefetch overlap only part). Equations, constants and their calibration: docs/cost_model.md.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from vfuse.fusion.cost_columns import column_runs, strided_s
from vfuse.fusion.forms import Form, Illegal, classify, numel_of, per_element_flops
from vfuse.fusion.gathers import interleave_loads
from vfuse.fusion.libm import scalar_flops
from vfuse.fusion.plan import Cost
from vfuse.ir import Graph, Kind, Node, Op, TensorType, opdef
from vfuse.ir.sym import hint
from vfuse.targets import Target

GAMMA = {"cpu": 0.5, "gpu": 0.8}
# GPU: keep >= 512 threads resident per SM to hide HBM latency, so a kernel gets
# regs_per_sm / 512 registers per thread, minus ~16 for indices and addresses.
GPU_MIN_RESIDENT_THREADS = 512
INDEX_REGS = 16
GEMM_ACCUMULATOR_REGS = 64  # a 128x128 tile over 256 threads holds 64 fp32 accumulators each
# Work granularity, i.e. what one hardware thread takes at a time.
CPU_POINTWISE_CHUNK_VECTORS = 16
GPU_POINTWISE_ELEMENTS_PER_THREAD = 4
CPU_GEMM_TILE = 64 * 64
GPU_GEMM_TILE = 64 * 64  # output points of one thread block (small tiles when the problem is small)
GPU_ROW_ELEMENTS_PER_THREAD = 4  # one block per row, 4 elements per thread, 32..1024 threads
# A GPU saturates its bandwidth with about half of its resident-thread slots busy (Little's law
# at HBM latency); parallelism below that slows the kernel proportionally.
GPU_SATURATION = 0.5
# Kernels with fewer loop points run on one thread (schedule/strategy.PARALLEL_MIN, which the
# schedule decides; the cost model sits below the schedule and keeps its own copy).
PARALLEL_MIN_ELEMENTS = 32 * 1024
# Ops the IR counts as >= 8 flops per element (exp, log, tanh, sigmoid, SiLU, GELU, erf, pow) run
# at the calibrated transcendental rate: per IR flop they take ~2-3x as long as cheap arithmetic.
TRANSCENDENTAL = 8


@dataclass(frozen=True, slots=True)
class Pressure:
    """On-chip resource use: live values per point against the register budget, and a row
    kernel's cached working set (bytes per row) against the cache or shared memory it has."""

    live: int
    reg_budget: int
    working_set: int
    ws_budget: int
    passes: int

    @property
    def ratio(self) -> float:
        ws = self.working_set / self.ws_budget if self.ws_budget else 0.0
        return max(self.live / self.reg_budget, ws)


def register_budget(target: Target, kind: Kind) -> int:
    if target.is_gpu:
        budget = min(target.regs_per_thread, target.regs_per_sm // GPU_MIN_RESIDENT_THREADS) - INDEX_REGS
        return budget - (GEMM_ACCUMULATOR_REGS if kind is Kind.CONTRACTION else 0)
    return target.regs_per_thread


def ws_budget(target: Target) -> int:
    """On-chip bytes one row kernel work item may keep: L2 per core, or shared memory per SM."""
    return target.smem_per_sm if target.is_gpu else target.l2_bytes


def default_outputs(nodes: Sequence[Node], graph: Graph) -> tuple[str, ...]:
    """Values that leave the kernel: read by a node outside it, or graph outputs."""
    inside = {n.name for n in nodes}
    return tuple(n.name for n in nodes if graph.is_output(n.name) or any(u not in inside for u in graph.users(n.name)))


def external_inputs(nodes: Sequence[Node]) -> tuple[str, ...]:
    inside = {n.name for n in nodes}
    return tuple(dict.fromkeys(i for n in nodes for i in n.inputs if i not in inside))


def registers(t: object) -> int:
    """32-bit registers one element of a value takes (f64/i64 take two)."""
    return max(1, t.dtype.itemsize // 4) if isinstance(t, TensorType) else 1


def live_values(nodes: Sequence[Node], graph: Graph) -> int:
    """Peak registers live at once evaluating one point in topological order; an input is
    loaded at its first use, every value dies after its last use inside the kernel."""
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            start.setdefault(v, i)
            end[v] = i
        start[n.name] = i
        end.setdefault(n.name, i)
    delta = [0] * (len(nodes) + 1)
    for v, s in start.items():
        r = registers(graph[v].type)
        delta[s] += r
        delta[end[v] + 1] -= r
    peak = run = 0
    for d in delta:
        run += d
        peak = max(peak, run)
    return peak


def _row_working_set(nodes: Sequence[Node], form: Form, graph: Graph) -> tuple[int, int]:
    """(bytes one row keeps cached across passes, number of passes). A row kernel makes one
    pass per chain of dependent reductions; full-space values read in a later pass than the one
    producing (or first loading) them must stay cached, or be re-read."""
    if form.rows == 0:
        return 0, 1
    passes: dict[str, int] = {}
    first_read: dict[str, int] = {}
    keep: dict[str, int] = {}
    for n in nodes:
        p = max((passes[i] + (graph[i].kind is Kind.REDUCE) for i in n.inputs if i in passes), default=0)
        passes[n.name] = p
        for i in n.inputs:
            born = passes[i] if i in passes else first_read.setdefault(i, p)
            if p > born and numel_of(graph[i]) == form.domain and i not in keep:
                keep[i] = graph[i].tensor_type.dtype.itemsize
    row_len = form.domain // max(form.rows, 1)
    return row_len * sum(keep.values()), max(passes.values(), default=0) + 1


def pressure_of(nodes: Sequence[Node], form: Form, graph: Graph, target: Target) -> Pressure:
    ws, passes = _row_working_set(nodes, form, graph)
    return Pressure(live_values(nodes, graph), register_budget(target, form.kind), ws, ws_budget(target), passes)


def fixed_rate(node: Node, graph: Graph, target: Target) -> float:
    """flop/s of a reduction or contraction node's whole-op flops: the matrix peak of its first
    operand's dtype where it runs on the matrix unit (OpDef.matrix_unit), the vector rate otherwise."""
    if node.kind is Kind.CONTRACTION and opdef(node.op).matrix_unit:
        return target.matrix_peak(graph[node.inputs[0]].tensor_type.dtype)
    return target.vector_f32


def _flops(nodes: Sequence[Node], form: Form, graph: Graph, target: Target) -> tuple[int, float, float, float]:
    """(total flops, compute seconds, the share of those seconds only a template pays, what torch's
    library would pay instead); broadcast nodes count once per point that evaluates them, which is how
    recompute of a duplicated or broadcast producer shows up."""
    total, seconds, pointwise_s, template_s, library_s = 0, 0.0, 0.0, 0.0, 0.0
    levels, chains = loop_levels(nodes, graph), Counter[int]()
    for n in nodes:
        if n.kind in (Kind.REDUCE, Kind.CONTRACTION):
            f = hint(opdef(n.op).flops(tuple(graph[i].type for i in n.inputs), n.type, n.attrs))  # type: ignore[arg-type]
            seconds += f / fixed_rate(n, graph, target)
            if n.kind is Kind.CONTRACTION:
                template_s += template_extra_s(n, graph, target)
                library_s += template_extra_s(n, graph, target, library=True)
                seconds += attention_extra_s(n, graph, target, f)
        else:
            points = hint(form.space.get(n.name, numel_of(n)))
            f = int(per_element_flops(n, graph) * points)
            g = int(gather_flops(n, graph, target) * points)
            pointwise_s += (f * time_weight(n, graph, target) + g) / target.vector_f32
            chains[levels[n.name]] += transcendental(n, graph, target)
            f += g
        total += f
    factor = chain_factor(tuple(chains.values()), target)
    return total, seconds + template_s + pointwise_s * factor, template_s, library_s


def after(node: Node) -> int:
    """1 for a value read in a later loop than its operands (a reduction's result, read in the row
    kernel's next pass; a contraction's, read by its epilogue), else 0."""
    return int(node.kind in (Kind.REDUCE, Kind.CONTRACTION))


def loop_levels(nodes: Sequence[Node], graph: Graph) -> dict[str, int]:
    """The loop each node of a kernel runs in (`schedule/nest` numbers a row kernel's passes the same
    way): 0, or one past the latest loop whose reduction or contraction it reads."""
    level: dict[str, int] = {}
    for n in nodes:
        level[n.name] = max((level[i] + after(graph[i]) for i in n.inputs if i in level), default=0)
    return level


# Query rows per attention task (schedule/microtile.ATTENTION_BLOCK_Q): a causal mask skips the key
# blocks above the diagonal, all but the diagonal block's share.
ATTENTION_BLOCK_Q = 64


def attention_extra_s(node: Node, graph: Graph, target: Target, flops: int) -> float:
    """On a target with calibrated attention (`Target.attention_task_s`): the fixed cost of each
    (batch, head) task spread over the threads, the flops at the template's own rate
    (`Target.attention_f32`, in its ratio to peak_f32) rather than the GEMM peak, less the flops a
    causal mask skips (the IR counts every score)."""
    if node.op is not Op.SDPA or not target.attention_task_s:
        return 0.0
    q = graph[node.inputs[0]].tensor_type.shape
    tasks, keys = math.prod(q[:-2]), graph[node.inputs[1]].tensor_type.shape[-2]
    peak = target.matrix_peak(graph[node.inputs[0]].tensor_type.dtype)
    own = peak * (target.attention_f32 / target.peak_f32 if target.attention_f32 else 1.0)
    skipped = max(0.0, 0.5 - ATTENTION_BLOCK_Q / 2 / max(keys, 1)) if node.attrs.get("causal") else 0.0
    return tasks * target.attention_task_s / target.max_threads + flops * ((1 - skipped) / own - 1 / peak)


# The GEMM / conv templates' operands and output: A and B are packed, C's tile is stored (with its
# epilogue); conv's input is copied into padded (phase) planes or gathered, its weight packed.
TEMPLATE_OPS = frozenset({Op.MATMUL, Op.CONV2D})


def template_extra_s(node: Node, graph: Graph, target: Target, library: bool = False) -> float:
    """On a target with calibrated contraction overheads (`Target.contraction_elem_s`): the
    template's time past its flops, per element of its operands and output spread over the threads,
    plus one call's fixed part. What a 16 x 16 x 16 GEMM (~1 us for 8 Kflop) or a K = 16 one pays.
    `library`: torch's library's own (`Target.library_elem_s`, `library_call_s`) instead."""
    if node.op not in TEMPLATE_OPS or not target.contraction_elem_s or target.is_gpu:
        return 0.0
    elements = sum(hint(numel_of(graph[i])) for i in node.inputs[:2]) + hint(numel_of(node))
    elem, call = (
        (target.library_elem_s, target.library_call_s)
        if library
        else (target.contraction_elem_s, target.contraction_call_s)
    )
    return elements * elem / target.max_threads + call


def transcendental(node: Node, graph: Graph, target: Target) -> bool:
    """A pointwise op the calibration prices apart from cheap arithmetic (calibrated targets only)."""
    if not target.transcendental_f32 or node.kind is not Kind.ELEMENTWISE:
        return False
    return any(op == node.op.value for op, _ in target.op_rates) or per_element_flops(node, graph) >= TRANSCENDENTAL


def chain_factor(chains: Sequence[int], target: Target) -> float:
    """How much longer a kernel's pointwise work takes than its ops alone, given the number of
    transcendental ops in each of its loops: a loop's work grows by `chain_weight` per such op past
    its first (each op alone runs at its own rate, chains of them slower: their constants compete
    for registers). A row kernel's passes and a GEMM's prologue and epilogue are separate loops,
    so their ops do not chain; the loops are weighed by their transcendental ops, which dominate."""
    ops = sum(chains)
    if not ops:
        return 1.0
    return sum(k * (1.0 + target.chain_weight * (k - 1)) for k in chains) / ops


def time_weight(node: Node, graph: Graph, target: Target) -> float:
    """Time of one of the node's IR flops in cheap-arithmetic flops (1.0 for most ops): a scalar
    libm call per element (`fusion/libm.py`) at its measured cost; else `vector_weight`. The
    planner's summaries weight their per-element flops the same way (`summary.node_facts`)."""
    scalar = scalar_flops(node, target)
    if scalar:
        return scalar / max(per_element_flops(node, graph), 1.0)
    return vector_weight(node, graph, target)


def vector_weight(node: Node, graph: Graph, target: Target) -> float:
    """Time of one of the node's IR flops, computed in vectors: on a calibrated target, vector_f32 /
    its own rate for an op timed alone (`Target.op_rates`: exp, tanh, sigmoid, GELU, SiLU, log),
    vector_f32 / transcendental_f32 for other transcendental ones; 1.0 for the rest."""
    if not target.transcendental_f32 or node.kind is not Kind.ELEMENTWISE:
        return 1.0
    for op, rate in target.op_rates:  # calibrated one by one
        if op == node.op.value:
            return target.vector_f32 / rate
    if per_element_flops(node, graph) < TRANSCENDENTAL:
        return 1.0
    return target.vector_f32 / target.transcendental_f32


# A gathered lane is a scalar load and its insert into the vector: two vector slots. Fits the 3x3 s2
# col2im on Zen 3 (AVX2, one thread): 9 gathered loads per point, 0.85 ms predicted, 0.77 measured.
GATHER_LANE_SLOTS = 2


def gather_flops(node: Node, graph: Graph, target: Target) -> float:
    """Cheap-arithmetic flops per point of a CPU kernel's gathered loads (`fusion/gathers.py`), every
    lane loaded alone (a GPU's lanes load apart anyway: no extra)."""
    if target.is_gpu:
        return 0.0
    return float(interleave_loads(node, graph) * target.simd_lanes * GATHER_LANE_SLOTS)


def _nbytes(node: Node) -> int:
    return node.type.nbytes


def parallelism(kind: Kind, domain: int, rows: int, target: Target) -> float:
    """Independent work items per hardware thread; below 1 part of the machine idles."""
    if kind is Kind.OPAQUE:
        return 1.0
    if kind is Kind.CONTRACTION and target.is_gpu:
        # A GEMM's unit of parallel work is an output tile owned by one thread block, which
        # keeps a whole SM busy: count tiles against SMs (saturation folds in below).
        return max(domain / GPU_GEMM_TILE, 1.0) / target.cores * GPU_SATURATION
    if kind is Kind.CONTRACTION:
        items = domain / CPU_GEMM_TILE
    elif rows and target.is_gpu:
        items = rows * min(1024, max(32, domain // rows // GPU_ROW_ELEMENTS_PER_THREAD))
    elif rows:
        items = rows
    elif target.is_gpu:
        items = domain / GPU_POINTWISE_ELEMENTS_PER_THREAD
    else:
        items = domain / (target.simd_lanes * CPU_POINTWISE_CHUNK_VECTORS)
    return max(items, 1.0) / target.max_threads


@dataclass(frozen=True, slots=True)
class Figures:
    """What the time equation needs to know about one kernel, however it was obtained
    (exactly from its nodes here, or compositionally by the planner)."""

    flops: int
    compute_s: float
    in_bytes: int
    out_bytes: int
    kind: Kind
    domain: int
    rows: int
    pressure: Pressure
    template_s: float = 0.0  # of compute_s, the template's own overheads (`Cost.template_s`)
    strided_runs: int = 0  # column walks' row runs (`cost_columns.column_runs`)
    library_extra_s: float = 0.0  # torch's library's overheads in place of template_s (`Cost.library_extra_s`)


def hinted(f: Figures) -> Figures:
    """Figures at the example sizes: a graph with symbolic sizes is costed at its hints (ir/sym.py)."""
    p = f.pressure
    return replace(
        f,
        flops=hint(f.flops),
        in_bytes=hint(f.in_bytes),
        out_bytes=hint(f.out_bytes),
        domain=hint(f.domain),
        rows=hint(f.rows),
        pressure=replace(p, working_set=hint(p.working_set)),
    )


def memory_bw(target: Target, nbytes: int) -> float:
    """Bytes/s of a kernel moving `nbytes`. Uncalibrated targets and GPUs: DRAM bandwidth at every
    size. Calibrated CPUs (`targets/calibrate.py`): L1 bandwidth up to half the cores' L1, L2 at half
    their L2, L3 at a quarter of L3, DRAM from the L3 size on, interpolated in log-log between them.
    No step at a cache size (a step made merges that cross it look unprofitable), and bandwidth never
    rises with size, so time grows with bytes and a merge that saves bytes still gains."""
    if target.is_gpu or target.l2_bw <= 0:
        return target.dram_bw
    l1 = target.l1_bw or target.l2_bw
    sizes = (target.l1_bytes * target.cores / 2, target.l2_bytes * target.cores / 2, target.l3_bytes / 4)
    sizes += (float(max(target.l3_bytes, 1)),)
    bws = tuple(itertools.accumulate((l1, target.l2_bw, target.cache_bw, target.dram_bw), min))
    if nbytes <= sizes[0]:
        return bws[0]
    for (s0, b0), (s1, b1) in itertools.pairwise(zip(sizes, bws)):
        if nbytes <= s1:
            if s1 <= s0:
                return b1
            w = math.log(nbytes / s0) / math.log(s1 / s0)
            return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))
    return bws[-1]


def serial(f: Figures, target: Target) -> bool:
    """A calibrated CPU kernel too small to fork threads (`schedule/strategy.PARALLEL_MIN`): one
    core runs it, with no fork/join but `serial_launch_s`. Contractions always fork."""
    return (
        target.serial_launch_s > 0
        and not target.is_gpu
        and f.kind is not Kind.CONTRACTION
        and f.domain < PARALLEL_MIN_ELEMENTS
    )


def cost_from(f: Figures, target: Target) -> Cost:
    """t = launch + (C + M - gamma min(C, M)) / min(1, parallelism / saturation) + spill."""
    f = hinted(f)
    nbytes = f.in_bytes + f.out_bytes
    memory_s = max(nbytes / memory_bw(target, nbytes), strided_s(f.strided_runs, nbytes, target))
    par = parallelism(f.kind, f.domain, f.rows, target)
    launch_s = target.launch_s
    if serial(f, target):
        par, launch_s = 1 / target.max_threads, target.serial_launch_s
    body = f.compute_s + memory_s - GAMMA[target.kind] * min(f.compute_s, memory_s)
    p = f.pressure
    spill_s = 0.0
    if p.live > p.reg_budget:
        # Spilled values go to local memory / stack and back once per point (8 bytes round trip).
        spill_s += (p.live - p.reg_budget) * 8 * f.domain / target.cache_bw
    if p.ws_budget and p.working_set > p.ws_budget:
        # The row no longer stays on chip: every later pass re-reads its inputs from DRAM.
        spill_s += (p.passes - 1) * f.in_bytes / target.dram_bw
    saturation = GPU_SATURATION if target.is_gpu else 1.0
    time_s = launch_s + body / min(1.0, par / saturation) + spill_s
    return Cost(f.flops, nbytes, f.compute_s, memory_s, launch_s, time_s, p.ratio, par, f.template_s, f.library_extra_s)


def retimed(cost: Cost, compute_s: float, kind: str = "cpu") -> float:
    """`cost.time_s` had the kernel (on a `kind` target) computed for `compute_s` seconds instead: the
    same bytes, launch, parallelism and spill, the overlap of compute and memory taken again."""

    def body(c: float) -> float:
        return c + cost.memory_s - GAMMA[kind] * min(c, cost.memory_s)

    saturation = GPU_SATURATION if kind == "gpu" else 1.0
    return cost.time_s + (body(compute_s) - body(cost.compute_s)) / min(1.0, cost.parallelism / saturation)


def kernel_cost(
    nodes: Sequence[Node], inputs: Collection[str], outputs: Collection[str], form: Form, graph: Graph, target: Target
) -> Cost:
    """Exact cost of one kernel whose form is known, from its nodes in topological order."""
    flops, compute_s, template_s, library_s = _flops(nodes, form, graph, target)
    in_bytes = sum(_nbytes(graph[i]) for i in inputs)
    out_bytes = sum(_nbytes(graph[o]) for o in outputs)
    p = pressure_of(nodes, form, graph, target)
    runs = column_runs(nodes, inputs, graph, target)
    fig = Figures(
        flops, compute_s, in_bytes, out_bytes, form.kind, form.domain, form.rows, p, template_s, runs, library_s
    )
    return cost_from(fig, target)


def estimate(nodes: Sequence[str], graph: Graph, target: Target, outputs: Sequence[str] | None = None) -> Cost:
    """Cost of running `nodes` (topologically ordered) as one kernel writing `outputs`
    (default: the values read outside it and graph outputs). Raises ValueError when the nodes
    form no legal kernel."""
    ns = [graph[n] for n in nodes]
    outs = default_outputs(ns, graph) if outputs is None else tuple(outputs)
    form = classify(ns, outs, graph)
    if isinstance(form, Illegal):
        raise ValueError(f"not a kernel ({form.rule}): {form.reason}")
    return kernel_cost(ns, external_inputs(ns), outs, form, graph, target)


def lower_bound_bytes(graph: Graph) -> int:
    """Traffic no plan can beat: every graph input read once, every output written once."""
    read = {i for n in graph.compute_nodes for i in n.inputs if graph[i].kind is Kind.SOURCE}
    written = {o for o in graph.outputs if graph[o].kind is not Kind.SOURCE}
    return sum(graph[v].type.nbytes for v in read | written)
