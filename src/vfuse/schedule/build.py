"""`build(plan, target) -> Program`: one kernel per fused group, torch steps between them.

Pointwise groups become one nest per output shape; groups with reductions become row kernels;
contraction groups become one template kernel with their epilogue fused (`contraction.py`;
through torch when the templates do not cover them); OPAQUE groups, and any group the lowering
cannot express (`Unsupported`), run through torch op by op. Consecutive kernels form one
native segment (one `extern "C"` call).
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.fusion.library import ContractionChoice, Efficiency, choose_gpu, library_efficiency, pointwise_choice
from vfuse.fusion.plan import Cost, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.ir import DType, Graph, Kind, Node, Op, TensorType
from vfuse.ir.defs.contraction import sdpa_dropout
from vfuse.ir.defs.layout import IndexBounds, index_bounds
from vfuse.ir.shapes import numel
from vfuse.ir.shapes import reduce as reduced_shape
from vfuse.ir.sym import env_of, hint, same
from vfuse.schedule import expr
from vfuse.schedule.contraction import (
    ATTENTION,
    FP32_ONLY,
    GPU_DTYPES,
    Caches,
    ContractionPlan,
    library_choice,
    plan_contraction,
)
from vfuse.schedule.conv_dgrad import staged_weights
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.fp8dot import fp8_split, with_fp8_dot
from vfuse.schedule.gpu import decide_contraction, decide_gpu, fp8_cores
from vfuse.schedule.horizontal import LABEL as HORIZONTAL
from vfuse.schedule.horizontal import components, computed_by, join_horizontal
from vfuse.schedule.int8dot import with_int8_dot
from vfuse.schedule.kernel import (
    AnyKernel,
    Buffer,
    BufKind,
    ContractionKernel,
    Kernel,
    Loop,
    Program,
    Segment,
    Step,
    Store,
    TorchStep,
)
from vfuse.schedule.lower import Lowerer, RowSpace, Unsupported, index_buffer
from vfuse.schedule.memory import plan_memory, reuse_in_place
from vfuse.schedule.microtile import AVX512, VectorUnit, vector_unit
from vfuse.schedule.nest import make_kernel, with_streaming
from vfuse.schedule.packed import packed_gemms
from vfuse.schedule.peel import with_ranges
from vfuse.schedule.residue import with_residues
from vfuse.schedule.rowhint import with_hint_copy
from vfuse.schedule.strategy import decide
from vfuse.schedule.table import with_table
from vfuse.targets import Target

TORCH_LABELS = ("opaque",)
DEFAULT_CACHES: Caches = (48 << 10, 1 << 20, 32 << 20)


def _pointwise_kernels(
    graph: Graph, group: int, label: str, nodes: set[str], name: str, outputs: list[str]
) -> list[Kernel]:
    """One pointwise nest per distinct output shape (each recomputes what it needs)."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for o in outputs:
        by_shape.setdefault(graph[o].tensor_type.shape, []).append(o)
    kernels = []
    for k, (shape, outs) in enumerate(by_shape.items()):
        sizes = dict(enumerate(shape))
        lw = Lowerer(graph, nodes, sizes, None)
        coords = tuple(Lin.var(Var(d)) for d in range(len(shape)))
        stores = [_store(lw, o, coords) for o in outs]
        loops = [Loop(d, n) for d, n in enumerate(shape)]
        bufs = tuple(sorted(lw.loaded | set(outs)))
        kernel = make_kernel(f"{name}_{k}" if k else name, group, label, lw.stmts, stores, [], loops, bufs)
        kernels.append(_with_checks(kernel, lw))
    return kernels


def _with_checks(k: Kernel, lw: Lowerer) -> Kernel:
    return dataclasses.replace(k, checks=tuple(dict.fromkeys(lw.checks))) if lw.checks else k


def _store(lw: Lowerer, out: str, coords: tuple[Lin, ...]) -> Store:
    t = lw.graph[out].tensor_type
    return Store(out, expr.row_major(coords, t.shape), lw.value(out, coords), t.dtype)


def _row_kernels(graph: Graph, group: int, label: str, nodes: set[str], name: str, outs: list[str]) -> list[Kernel]:
    """One row kernel for the outputs in the row space or its reduction; outputs of other
    shapes (e.g. a scalar FULL the planner put here and others read too) get pointwise kernels."""
    reduces = [graph[n] for n in nodes if graph[n].kind is Kind.REDUCE]
    first = reduces[0]
    src = graph[first.inputs[0]].tensor_type.shape
    axes = tuple(first.attrs["axes"])
    axes = tuple(range(len(src))) if axes is None else axes
    row = RowSpace(src, axes, tuple(range(len(src))))
    lw = Lowerer(graph, nodes, dict(enumerate(src)), row)
    stores, others = [], []
    for o in outs:
        coords = _row_coords(row, graph[o].tensor_type.shape, lw.sizes)
        if coords is None:
            others.append(o)
        else:
            stores.append(_store(lw, o, coords))
    outer = [Loop(d, n) for d, n in enumerate(src) if d not in axes]
    inner = [Loop(d, n) for d, n in enumerate(src) if d in axes]
    bufs = tuple(sorted(lw.loaded | {st.buf for st in stores}))
    kernel = make_kernel(name, group, label, lw.stmts, stores, outer, inner, bufs) if stores else None
    kernels = [_with_checks(kernel, lw)] if kernel else []
    return kernels + _pointwise_kernels(graph, group, label, nodes, f"{name}_x", others)


def _row_coords(row: RowSpace, shape: tuple[int, ...], sizes: dict[int, int]) -> tuple[Lin, ...] | None:
    """Where a row kernel stores an output of `shape`: the row space, its reduction, or a
    reshape of either (e.g. LayerNorm's output viewed as a matrix for the next matmul)."""
    src, axes = row.shape, row.axes
    # Shapes match structurally (symbolic sizes: ir/sym.py `same`); a "no" tries the other forms.
    if same(shape, src):
        return row.full_coords()
    for keep in (True, False):
        if same(shape, reduced_shape(src, axes, keep)):
            return row.reduced_coords(keep)
    red = reduced_shape(src, axes, False)
    if same(numel(shape), numel(src)):
        return expr.unflatten(expr.row_major(row.full_coords(), src), shape, sizes)
    if same(numel(shape), numel(red)):
        return expr.unflatten(expr.row_major(row.reduced_coords(False), red), shape, sizes)
    return None


def _contraction_split(graph: Graph, g: Group) -> tuple[list[str], set[str]]:
    """(nodes torch runs: each contraction and its in-group producers, rest for a kernel)."""
    members = set(g.nodes)
    torch_side: set[str] = set()
    stack = [n for n in g.nodes if graph[n].kind in (Kind.CONTRACTION, Kind.OPAQUE)]
    while stack:
        n = stack.pop()
        if n not in torch_side:
            torch_side.add(n)
            stack += [i for i in graph[n].inputs if i in members]
    return [n for n in g.nodes if n in torch_side], members - torch_side


def _contraction_steps(
    graph: Graph, g: Group, caches: Caches, unit: VectorUnit, gpu: object = None, efficiency: Efficiency = Efficiency()
) -> tuple[list[AnyKernel | TorchStep], set[str]]:
    """The steps running the contraction of `g`, and the group nodes left for ordinary kernels
    (`gpu`: a GPU target, whose Triton templates also take fp16 / bf16 and get their tiles here;
    `efficiency`: a CPU target's library GEMM rate over the template's)."""
    try:
        dtypes = GPU_DTYPES if gpu is not None else FP32_ONLY
        cp = plan_contraction(graph, g.nodes, g.outputs, g.id, g.label, caches, unit, dtypes)
        if gpu is None:
            choice = library_choice(graph, g.cost, cp, efficiency)
        else:
            choice = gpu_library_choice(graph, g.cost, cp, gpu)
        if choice.library:
            return _library_steps(graph, g, choice.reason(), gpu is None)  # torch is predicted faster
        kernel = decide_contraction(cp.kernel, gpu, graph, g.retile) if gpu is not None else cp.kernel
        copies: list[AnyKernel | TorchStep] = []
        for i, v in enumerate(cp.copies):
            copies += _pointwise_kernels(graph, g.id, g.label, set(cp.prologue), f"k{g.id}_in{i}", [v])
        return [*copies, kernel], set(cp.rest)
    except Unsupported as e:
        torch_nodes, rest = _contraction_split(graph, g)
        return [TorchStep(g.id, g.label, tuple(torch_nodes), f"contraction through torch: {e}")], rest


def _library_steps(graph: Graph, g: Group, reason: str, native: bool) -> tuple[list[AnyKernel | TorchStep], set[str]]:
    """A contraction through torch, the rest of its group fused; on CPU a conv weight the group
    computes by a CAT (a data gradient's flipped taps) is stored first by a native kernel
    (`schedule/conv_dgrad.py`), so the torch step is the conv alone."""
    torch_nodes, rest = _contraction_split(graph, g)
    staged, torch_nodes = staged_weights(graph, set(g.nodes), torch_nodes) if native else ([], torch_nodes)
    copies = _pointwise_kernels(graph, g.id, g.label, set(g.nodes), f"k{g.id}_w", staged) if staged else []
    packed = packed_gemms(graph, torch_nodes) if native else ()
    step = TorchStep(g.id, g.label, tuple(torch_nodes), f"contraction through torch: {reason}", packed)
    return [*copies, step], rest


def gpu_library_choice(graph: Graph, cost: Cost, cp: ContractionPlan, gpu: object = None) -> ContractionChoice:
    """`fusion/library.py`'s GPU verdict for a planned contraction group (attention with dropout
    stays a template: torch's path would not draw vfuse's mask; so does an fp8 dot, which torch
    would compute as an fp32 matmul of the widened operands, at a thirtieth of fp8's peak)."""
    k = cp.kernel
    family = "attention" if k.op in ATTENTION else "conv" if k.op is Op.CONV2D else "gemm"
    if family == "attention" and sdpa_dropout(k.attrs):
        return ContractionChoice(0.0, math.inf)
    if gpu is not None and with_fp8_dot(k, graph, fp8_cores(gpu)).fp8 is not None:
        return ContractionChoice(0.0, math.inf)
    epilogue = bool(k.epilogue) or bool(cp.rest)
    return choose_gpu(cost, family, hint(graph[k.node].type.nbytes), epilogue)


def group_steps(
    graph: Graph,
    g: Group,
    caches: Caches = DEFAULT_CACHES,
    templates: bool = True,
    unit: VectorUnit = AVX512,
    gpu: object = None,
    efficiency: Efficiency = Efficiency(),
) -> list[AnyKernel | TorchStep]:
    """The kernels and torch steps that run one group (`templates`: contractions get a generated
    kernel; without, they run through torch and the rest of their group as ordinary kernels;
    `gpu`: the GPU target the templates are tiled for)."""
    name = f"k{g.id}"
    if g.label in TORCH_LABELS or g.kind is Kind.OPAQUE:
        return [TorchStep(g.id, g.label, g.nodes, "opaque op")]
    if all(graph[o].tensor_type.numel == 0 for o in g.outputs):
        # Nothing to compute, and index maps over a size-0 dim would divide by zero.
        return [TorchStep(g.id, g.label, g.nodes, "empty tensors")]
    if split := fp8_split(graph, g, gpu is not None, fp8_cores(gpu)):
        side, rest, why = split  # the fp8 part in torch, the rest of the group compiled after it
        after = group_steps(graph, rest, caches, templates, unit, gpu, efficiency) if rest is not None else []
        return [TorchStep(g.id, g.label, side, f"fallback: {why}"), *after]
    out: list[AnyKernel | TorchStep] = []
    nodes = set(g.nodes)
    if any(graph[n].kind is Kind.CONTRACTION for n in g.nodes) and templates:
        out, nodes = _contraction_steps(graph, g, caches, unit, gpu, efficiency)
    elif any(graph[n].kind is Kind.CONTRACTION for n in g.nodes):
        torch_nodes, nodes = _contraction_split(graph, g)
        out = [TorchStep(g.id, g.label, tuple(torch_nodes), "contraction through torch: no template for this backend")]
    # The planner may recompute a node in several groups: only the group's outputs are stored.
    outs = [o for o in g.outputs if o in nodes]
    if not outs:
        return out
    try:
        pre, nodes = _index_kernels(graph, g, nodes, name)
        outs = [o for o in outs if o in nodes]
        out += pre
        if any(graph[n].kind is Kind.REDUCE for n in nodes):
            out += _reduction_kernels(graph, g, nodes, name, outs)
        elif g.label == HORIZONTAL:
            out += _horizontal_kernels(graph, g, nodes, name, outs)
        else:
            out += _pointwise_kernels(graph, g.id, g.label, nodes, name, outs)
    except Unsupported as e:
        ordered = tuple(n for n in g.nodes if n in nodes)
        out.append(TorchStep(g.id, g.label, ordered, f"fallback: {e}"))
    return out


def _horizontal_kernels(graph: Graph, g: Group, nodes: set[str], name: str, outs: list[str]) -> list:
    """A nest per independent update (`horizontal.components`); an update whose nest cannot be
    lowered runs through torch alone, not the whole horizontal group (first: the nests stay
    consecutive, one kernel)."""
    kernels: list[AnyKernel | TorchStep] = []
    torch_steps: list[AnyKernel | TorchStep] = []
    for k, part in enumerate(components(graph, nodes, outs)):
        try:
            kernels += _pointwise_kernels(graph, g.id, g.label, nodes, f"{name}_h{k}" if k else name, part)
        except Unsupported as e:
            need = computed_by(graph, nodes, part)
            torch_steps.append(TorchStep(g.id, g.label, tuple(n for n in g.nodes if n in need), f"fallback: {e}"))
    return torch_steps + kernels


def _index_kernels(graph: Graph, g: Group, nodes: set[str], name: str) -> tuple[list[Kernel], set[str]]:
    """Computed gather indices are stored first: the gather's kernel checks a buffer's values.
    In stages: an index computed by a checked gather of a computed index (BERT's token types
    gathered at `position_ids[:, :t]`) is stored after that index. Returns the kernels and
    the nodes left to the group's own kernels."""
    kernels: list[Kernel] = []
    while idx := _computed_indices(graph, [n for n in g.nodes if n in nodes]):
        ready = [i for i in idx if not _computed_indices(graph, _ordered(g, computed_by(graph, nodes, [i])))]
        if not ready:
            raise Unsupported(f"gather indices {idx} depend on each other")
        stage = f"{name}_ix{len(kernels)}" if kernels else f"{name}_ix"
        kernels += _pointwise_kernels(graph, g.id, g.label, nodes, stage, ready)
        nodes = nodes - set(ready)
    return kernels, nodes


def _ordered(g: Group, nodes: set[str]) -> list[str]:
    return [n for n in g.nodes if n in nodes]


def _computed_indices(graph: Graph, nodes: list[str]) -> list[str]:
    """Indices of checked gathers in `nodes` that a kernel of `nodes` would compute itself."""
    inside = set(nodes)
    out = [
        graph[n].inputs[1]
        for n in nodes
        if graph[n].op is Op.EMBEDDING
        and index_bounds(graph[n].attrs) is not IndexBounds.TRUSTED
        and index_buffer(graph, inside, graph[n].inputs[1]) is None
    ]
    return list(dict.fromkeys(out))


def _reduction_kernels(graph: Graph, g: Group, nodes: set[str], name: str, outs: list[str]) -> list[Kernel]:
    """One row kernel; if its epilogue reads a reduction at another row (e.g. through a CAT or
    a slice of the reduced axis), store the reductions and run the epilogue as pointwise kernels."""
    try:
        return _row_kernels(graph, g.id, g.label, nodes, name, outs)
    except Unsupported:
        reduces = [n for n in g.nodes if n in nodes and graph[n].kind is Kind.REDUCE]
        rest = [o for o in outs if o not in reduces]
        row = _row_kernels(graph, g.id, g.label, nodes, name, reduces)
        return row + _pointwise_kernels(graph, g.id, g.label, nodes - set(reduces), f"{name}_e", rest)


def _segments(items: list[AnyKernel | TorchStep]) -> list[Step]:
    steps: list[Step] = []
    run: list[AnyKernel] = []
    for it in items:
        if not isinstance(it, TorchStep):
            run.append(it)
            continue
        if run:
            steps.append(Segment(f"vf_seg{len(steps)}", tuple(run), (), ()))
            run = []
        steps.append(it)
    if run:
        steps.append(Segment(f"vf_seg{len(steps)}", tuple(run), (), ()))
    return steps


def build(plan: FusionPlan, target: object, templates: bool = True, triton: bool = False) -> Program:
    """Schedule every group of `plan` for `target`: its `simd_lanes` (fp32 lanes per vector
    instruction) is the vector width every kernel's walk and reductions are decided for; a GPU
    target also gets each kernel's GPU launch (`gpu.py`). `templates=False`: contractions run
    through torch (a backend without contraction templates). `triton`: the program is for the
    Triton renderer, whose templates take fp16 / bf16 too and get GPU tiles (`gpu.py`)."""
    graph = plan.graph
    caches = tuple(int(getattr(target, f"l{n}_bytes", d)) for n, d in zip((1, 2, 3), DEFAULT_CACHES, strict=True))
    items: list[AnyKernel | TorchStep] = []
    unit = vector_unit(int(getattr(target, "simd_lanes", 16)), int(getattr(target, "regs_per_thread", 32)))
    gpu = target if triton and getattr(target, "is_gpu", False) else None
    efficiency = library_efficiency(target)  # the tier's calibrated template-or-library figure
    for g in plan.groups:
        if g.label == Rule.LIBRARY_POINTWISE.value:  # the planner kept a scalar-libm op in torch
            items.append(TorchStep(g.id, g.label, g.nodes, _pointwise_reason(graph, g, target)))
            continue
        items += group_steps(graph, g, caches, templates, unit, gpu, efficiency)  # type: ignore[arg-type]
    vector = int(getattr(target, "simd_lanes", 16))

    def schedule(k: Kernel) -> Kernel:
        return with_ranges(
            with_residues(decide(with_streaming(with_table(k), caches[2]), vector, caches[0], caches[2], caches[1]))
        )

    # C++ kernels over short rows of a symbolic length also get a copy scheduled at the length's
    # hint (`rowhint.py`; the Triton renderer has no such copy).
    copies = not triton and not getattr(target, "is_gpu", False)
    items = [(with_hint_copy(k, schedule) if copies else schedule(k)) if isinstance(k, Kernel) else k for k in items]
    extras = getattr(target, "isa_extras", frozenset())
    items = [with_int8_dot(k, graph, extras) if isinstance(k, ContractionKernel) else k for k in items]
    if getattr(target, "is_gpu", False):
        retile = {g.id: g.retile for g in plan.groups}
        items = [decide_gpu(k, target, graph, retile.get(k.group, 0)) if isinstance(k, Kernel) else k for k in items]
    elif templates and not triton:  # the C++ renderer (the Triton one has no horizontal walk)
        items = join_horizontal(items)
    steps = _segments(items)
    stored = {st.buf for s in steps if isinstance(s, Segment) for k in s.kernels for st in _stores(k)}
    torch_made = {n for s in steps if isinstance(s, TorchStep) for n in s.nodes} - stored
    _check_produced(graph, steps, stored | torch_made)
    buffers, seeds = _buffers(graph, steps, torch_made)
    arena = {v for v, b in buffers.items() if b.kind is BufKind.ARENA}
    shared: dict[str, str] = {}
    if not triton and not getattr(target, "is_gpu", False):  # C++ kernels: stores over dying reads
        steps, shared = reuse_in_place(graph, steps, arena)
    memory = plan_memory(graph, steps, arena, shared)
    buffers = {
        v: Buffer(b.value, b.type, b.kind, memory.offsets[v]) if b.kind is BufKind.ARENA else b
        for v, b in buffers.items()
    }
    steps = [_with_io(s, buffers) if isinstance(s, Segment) else s for s in steps]
    # Every node's sizes and attrs, not only the inputs': a backward whose only tensor input is a
    # 0-d gradient gets its symbols from SymInt arguments, and its kernels still read them.
    env = env_of(v for n in graph for v in (*_shape_of(n), *(a for _, a in n.attrs.items_)))
    symbols = tuple(s.name for s in env.symbols) if env is not None else ()
    return Program(tuple(steps), buffers, memory, tuple(seeds), vector, getattr(target, "isa", None), symbols=symbols)


def _pointwise_reason(graph: Graph, g: Group, target: object) -> str:
    choice = pointwise_choice(graph[g.nodes[0]], graph, target) if isinstance(target, Target) else None
    rule = Rule.LIBRARY_POINTWISE
    return choice.reason() if choice is not None else f"{rule.value}: {rule.meaning}"


def _check_produced(graph: Graph, steps: list[Step], made: set[str]) -> None:
    """Every value a kernel loads must be a source or written by an earlier step."""
    for s in steps:
        if isinstance(s, Segment):
            for k in s.kernels:
                for v in k.buffers:
                    if v not in made and graph[v].kind is not Kind.SOURCE:
                        raise ValueError(f"kernel {k.name} reads %{v}, which no group of the plan outputs")


def _buffers(graph: Graph, steps: list[Step], torch_made: set[str]) -> tuple[dict[str, Buffer], list[str]]:
    """Every value a kernel touches, with where it lives (arena slots filled in later)."""
    buffers: dict[str, Buffer] = {}
    seeds: list[str] = []
    slots = 0
    for seg in steps:
        if not isinstance(seg, Segment):
            continue
        for k in seg.kernels:
            for v in k.buffers:
                if v in buffers:
                    continue
                node = graph[v]
                if node.op is Op.RNG_SEED:
                    buffers[v] = Buffer(v, node.tensor_type, BufKind.SEED, len(seeds))
                    seeds.append(v)
                elif node.kind is Kind.SOURCE or v in torch_made:
                    buffers[v] = Buffer(v, node.tensor_type, BufKind.INPUT, slots)
                    slots += 1
                elif graph.is_output(v):
                    buffers[v] = Buffer(v, node.tensor_type, BufKind.OUTPUT, slots)
                    slots += 1
                else:
                    buffers[v] = Buffer(v, node.tensor_type, BufKind.ARENA, 0)
    return buffers, seeds


def _with_io(seg: Segment, buffers: dict[str, Buffer]) -> Segment:
    stored = {st.buf for k in seg.kernels for st in _stores(k)}
    read = {v for k in seg.kernels for v in k.buffers} - stored
    ins = tuple(sorted(v for v in read if buffers[v].kind is not BufKind.ARENA))
    outs = tuple(sorted(v for v in stored if buffers[v].kind is BufKind.OUTPUT))
    return Segment(seg.name, seg.kernels, ins, outs)


def _stores(k: AnyKernel) -> list[Store]:
    if isinstance(k, ContractionKernel):
        return [Store(k.out, Lin(), k.result, DType.F32), *k.stores, *((k.colsum,) if k.colsum else ())]
    out = [s for p in k.passes for s in p.body if isinstance(s, Store)]
    return out + [s for s in k.after if isinstance(s, Store)]


def _shape_of(n: Node) -> tuple[tuple[object, ...], ...]:
    return (n.type.shape,) if isinstance(n.type, TensorType) else ()
