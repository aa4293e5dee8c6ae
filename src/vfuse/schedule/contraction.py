"""Contraction groups ("gemm", "conv", "attention") as one generated kernel each.

A group holds one CONTRACTION node, cheap prologues on its operands and a pointwise epilogue
in its output space. `plan_contraction` decides how it runs natively:

* Operands are read from buffers. A reshape of a buffer is the same bytes (read in place); a
  MATMUL rhs that is the transpose of a buffer (nn.Linear's `x @ W^T`) is read as `trans_b`.
  Any other in-group MATMUL operand (a cast, a dequantize `(q - zp) * scale`, a permute) is
  lowered by the ordinary `Lowerer` at one operand element (`OperandPrologue`) and computed
  while its panel is packed, so it is never stored. A conv / attention operand computed in
  the group, or a MATMUL operand the lowering cannot express, is materialized first by a
  pointwise copy kernel of the prologue.
* Fused: when the group stores exactly one value laid out like the contraction's output,
  its epilogue is lowered by the ordinary `Lowerer` with the contraction's value at the
  output element pre-bound to the accumulator `v`; the template applies it per element.
  GEMM outputs may have any dtype (an int8 quantize epilogue ends in a cast); conv and
  attention outputs are fp32.
* Split: otherwise (several outputs, the contraction's value read at another element, an
  attention epilogue that reads buffers) the contraction stores its own value and the rest
  of the group runs as ordinary kernels after it.

Anything the templates do not cover (non-fp32 operands of the contraction node itself,
unsupported geometry) raises `Unsupported`; the caller then runs the contraction through
torch as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vfuse.fusion.library import ContractionChoice, Efficiency, bandwidth_of, choose, producers_s, tile_waste
from vfuse.fusion.plan import Cost
from vfuse.ir import DType, Graph, Kind, Op
from vfuse.ir.defs.contraction import sdpa_dropout, sdpa_has_mask
from vfuse.ir.shapes import numel
from vfuse.ir.sym import hint, is_sym, same
from vfuse.schedule import expr
from vfuse.schedule.colsum import column_store, split_column_sum
from vfuse.schedule.conv_blocks import template_blocks
from vfuse.schedule.conv_columns import compact_columns, conv_columns, direct_conv
from vfuse.schedule.conv_fold import folded_conv, folded_mnk, swapped_base
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.kernel import ContractionKernel, Load, OperandPrologue, Rand, RandKey, ScatterWalk, Stmt, Store
from vfuse.schedule.lower import Lowerer, Unsupported
from vfuse.schedule.microtile import (
    AVX512,
    Tile,
    VectorUnit,
    attention_blocks,
    attention_tile,
    gemm_order_tiles,
    pick_micro_tile,
)
from vfuse.schedule.transposed_a import transposed_a_blocks

Caches = tuple[int, int, int]
ATTENTION = frozenset({Op.SDPA, Op.SDPA_LSE, Op.SDPA_BACKWARD})
# Training attention returns one flat tensor of several values: the template stores it, no epilogue.
FLAT_OUTPUT = frozenset({Op.SDPA_LSE, Op.SDPA_BACKWARD})
# Contractions without a Triton template: on backend="triton" they run in torch (a TorchStep).
# SCATTER_ADD: Triton's atomic adds would sum in no fixed order; torch's kernel is deterministic.
TRITON_IN_TORCH = frozenset({Op.SDPA_LSE, Op.SDPA_BACKWARD, Op.SCATTER_ADD})
# Templates that store their own value only: the rest of the group runs as ordinary kernels after.
NO_EPILOGUE = FLAT_OUTPUT | {Op.SCATTER_ADD}
# A scatter this small (output plus terms, in elements) runs on one thread.
SCATTER_THREADED = 32768
# Planes split between threads from this many on (enough for 16 threads); fewer, output row ranges.
SCATTER_PLANES = 16


@dataclass(frozen=True)
class ContractionPlan:
    """What runs one contraction group: copies of operands, the kernel, then leftover nodes."""

    copies: tuple[str, ...]  # operand values a pointwise kernel of `prologue` stores first
    prologue: frozenset[str]  # group nodes feeding the contraction
    kernel: ContractionKernel
    rest: frozenset[str]  # nodes still to run as ordinary kernels (empty when fused)


class _EpilogueLowerer(Lowerer):
    """Variables get their own prefix: they live inside the templates' loops next to their names.
    The templates have no fault record: checked gathers and integer division stay outside."""

    prefix = "ev"
    faults = False

    def fresh(self) -> str:
        self._count += 1
        return f"{self.prefix}{self._count}"


class _PrologueLowerer(_EpilogueLowerer):
    prefix = "pv"


def _split(graph: Graph, nodes: tuple[str, ...]) -> tuple[str, frozenset[str], frozenset[str]]:
    """(the contraction, its in-group producers, everything after it)."""
    members = set(nodes)
    found = [n for n in nodes if graph[n].kind is Kind.CONTRACTION]
    if len(found) != 1 or any(graph[n].kind is Kind.OPAQUE for n in nodes):
        raise Unsupported("a contraction group needs exactly one contraction and no opaque op")
    node = found[0]
    prologue = graph.ancestors(node, members)
    return node, frozenset(prologue), frozenset(members - prologue - {node})


def _in_place(graph: Graph, prologue: frozenset[str], v: str) -> str | None:
    """The buffer holding `v`'s row-major bytes without a copy: `v` itself unless it is computed
    in the group, through any chain of in-group reshapes."""
    while v in prologue and graph[v].op is Op.RESHAPE:
        v = graph[v].inputs[0]
    return None if v in prologue else v


def _transposed(graph: Graph, prologue: frozenset[str], v: str) -> str | None:
    """The buffer B when `v` is B with its last two dims swapped (and read in place)."""
    node = graph[v]
    if v not in prologue or node.op is not Op.PERMUTE:
        return None
    perm = tuple(node.attrs["perm"])
    r = len(perm)
    if r < 2 or perm != (*range(r - 2), r - 1, r - 2):
        return None
    return _in_place(graph, prologue, node.inputs[0])


class _Operands:
    """Operand buffers in order, the in-group values that must be copied out first, and the
    MATMUL operands computed while packing (`prologues`, aligned with `names`)."""

    def __init__(self, graph: Graph, prologue: frozenset[str]) -> None:
        self.graph, self.prologue = graph, prologue
        self.names: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.copies: list[str] = []
        self.prologues: list[OperandPrologue | None] = []

    def add(self, v: str) -> None:
        base = _in_place(self.graph, self.prologue, v)
        if base is None:
            self.copies.append(v)
            base = v
        self.add_buffer(base, self.graph[v].tensor_type.shape)

    def add_buffer(self, buf: str, shape: tuple[int, ...]) -> None:
        self.names.append(buf)
        self.shapes.append(shape)
        self.prologues.append(None)

    def add_packed(self, v: str) -> None:
        """A GEMM operand: in place if it is a buffer, else computed in the packer when the
        lowering expresses it, else copied out first."""
        pro = None if _in_place(self.graph, self.prologue, v) else _lower_operand(self.graph, self.prologue, v)
        if pro is None:
            self.add(v)
            return
        self.add_buffer(v, self.graph[v].tensor_type.shape)
        self.prologues[-1] = pro

    @property
    def loads(self) -> set[str]:
        return {b for p in self.prologues if p is not None for b in p.loads}


def _lower_operand(graph: Graph, prologue: frozenset[str], v: str) -> OperandPrologue | None:
    """`v` (an in-group value) at one element of its shape, or None if the lowering cannot
    express it (the copy path then stores it first)."""
    shape = graph[v].tensor_type.shape
    lw = _PrologueLowerer(graph, set(prologue), dict(enumerate(shape)), None)
    try:
        result = lw.value(v, tuple(Lin.var(Var(d)) for d in range(len(shape))))
    except Unsupported:
        return None
    return OperandPrologue(tuple(lw.stmts), result, tuple(sorted(lw.loaded)), _inner_dim(graph, lw.stmts, len(shape)))


def _inner_dim(graph: Graph, stmts: list[Stmt], rank: int) -> int:
    """-2 when the loads are contiguous along the operand's rows (a transposed buffer), else -1:
    each load votes with its buffer's size for the dim it walks with unit stride."""
    votes = {-1: 0, -2: 0}
    for s in stmts:
        if isinstance(s, Load):
            for d in (-1, -2):
                if s.index.coef(Var(rank + d)) == 1:
                    votes[d] += graph[s.buf].tensor_type.numel
    return -2 if votes[-2] > votes[-1] else -1


def _packed_once(graph: Graph, op: Op, attrs: Mapping[str, Any], ops: _Operands) -> bool:
    """Operand 1 is the same on every call, packed once (`ContractionKernel.prepacked_b`): a GEMM's B
    that is a constant buffer (frozen weight) or computed by its prologue from constants only, one
    matrix for all batch entries; a conv's constant weight, read as is (codegen/cpp/gemm/conv_prepack.py)."""
    buf, shape, pro = ops.names[1], ops.shapes[1], ops.prologues[1]
    if op is Op.CONV2D:
        return not attrs.get("folded") and pro is None and graph[buf].op is Op.CONSTANT
    sources = pro.loads if pro is not None else (buf,)
    drawn = pro is not None and any(isinstance(s, Rand | RandKey) for s in pro.stmts)
    one = op is Op.MATMUL and math.prod(shape[:-2]) == 1 and not drawn
    return one and all(graph[v].op is Op.CONSTANT for v in sources)


FP32_ONLY = frozenset({DType.F32})
GPU_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})  # the Triton templates (codegen/triton)


def _check_types(graph: Graph, node: str, dtypes: frozenset[DType] = FP32_ONLY) -> None:
    n = graph[node]
    if n.op is Op.SCATTER_ADD:
        _check_scatter(graph, node, dtypes)
        return
    types = [graph[i].tensor_type for i in n.inputs]
    dtype = n.tensor_type.dtype
    if any(t.dtype is not dtype for t in types[:3]) or dtype not in dtypes:
        raise Unsupported(f"%{node}: the contraction templates take {sorted(d.value for d in dtypes)} only")
    if n.op is Op.SDPA and sdpa_has_mask(len(types), n.attrs) and types[3].dtype not in (dtype, DType.BOOL):
        raise Unsupported(f"%{node}: attention mask of {types[3].dtype.value}")
    if any(math.prod(t.shape) == 0 for t in (*types, n.tensor_type)):
        raise Unsupported(f"%{node} is empty")


def _gemm_operands(graph: Graph, node: str, ops: _Operands) -> bool:
    a, b = graph[node].inputs
    if min(graph[a].tensor_type.rank, graph[b].tensor_type.rank) < 2:
        raise Unsupported(f"%{node}: matmul of a vector")
    ops.add_packed(a)
    base = _transposed(graph, ops.prologue, b)
    if base is not None:
        # Read as the shape the transpose saw: reshapes in between are free (IR values are
        # contiguous), but the base's own shape may differ (a vector unsqueezed, dims split).
        ops.add_buffer(base, graph[graph[b].inputs[0]].tensor_type.shape)
        return True
    ops.add_packed(b)
    return False


def _conv_operands(graph: Graph, node: str, ops: _Operands, cpu: bool) -> bool:
    """Adds the operands; True when the folded template reads both in place through their swap
    of the first two dims (a weight gradient's x and grad_output; schedule/conv_fold.py)."""
    attrs = graph[node].attrs
    geometry = (attrs["stride"], attrs["padding"], attrs["dilation"])
    if not all(isinstance(p, tuple | list) and len(p) == 2 and all(isinstance(x, int) for x in p) for p in geometry):
        raise Unsupported(f"%{node}: conv geometry {geometry} is not (h, w) integer pairs")
    inputs = graph[node].inputs
    shapes = [graph[i].tensor_type.shape for i in inputs]
    # The folded template reads swapped operands of one group only (conv_wgrad.render_conv2d_folded).
    if cpu and attrs["groups"] == 1 and folded_conv(attrs, *shapes, graph[node].tensor_type.shape):
        bases = [swapped_base(graph, ops.prologue, i) for i in inputs]
        if all(bases):
            for b, shape in zip(bases, shapes, strict=True):
                ops.add_buffer(b, shape)  # the conv's shape over B's bytes, read swapped
            return True
    for i in inputs:
        ops.add(i)
    return False


def _sdpa_operands(graph: Graph, node: str, ops: _Operands, dtypes: frozenset[DType]) -> None:
    n = graph[node]
    if sdpa_dropout(n.attrs) and n.op is Op.SDPA and dtypes is not GPU_DTYPES:
        raise Unsupported(f"%{node}: attention dropout (the C++ templates draw it only in training's SDPA_LSE)")
    if n.op in TRITON_IN_TORCH and dtypes is GPU_DTYPES:
        raise Unsupported(f"%{node}: no Triton template for {n.op.value}")
    first = 1 if n.op is Op.SDPA_BACKWARD else 0  # its inputs start with grad_out
    q, k, v = (graph[i].tensor_type.shape for i in n.inputs[first : first + 3])
    rank = len(q)
    if rank not in (3, 4) or len(k) != rank or len(v) != rank or k[:-1] != v[:-1] or q[:-3] != k[:-3]:
        raise Unsupported(f"%{node}: attention operands {q}, {k}, {v} are not [B,]H,L,D with shared batch")
    if q[-3] % k[-3] or (k[-3] != q[-3] and not n.attrs["gqa"]):
        raise Unsupported(f"%{node}: {q[-3]} query heads over {k[-3]} key heads")
    # The templates' head sizes are compile-time constants (unrolled): a symbolic one is
    # specialized (int() records its equality guard); codegen reads them with int() too.
    int(q[-1]), int(v[-1])
    for i in n.inputs:
        ops.add(i)


def _check_scatter(graph: Graph, node: str, dtypes: frozenset[DType]) -> None:
    """The C++ template takes what the op's type rule admits (fp32 / fp64 values, int32 / int64
    indices), not empty; Triton has no deterministic one (TRITON_IN_TORCH)."""
    if dtypes is GPU_DTYPES:
        raise Unsupported(f"%{node}: no Triton template for {Op.SCATTER_ADD.value}")
    n = graph[node]
    if any(numel(graph[i].tensor_type.shape) == 0 for i in n.inputs) or numel(n.tensor_type.shape) == 0:
        raise Unsupported(f"%{node} is empty")


def scatter_walk(values: tuple[int, ...], out: tuple[int, ...], taps: int = 1) -> ScatterWalk:
    """Who adds which terms (`ScatterWalk`): one thread for small scatters, planes between threads
    where there are enough, else ranges of output rows (each thread reads every index)."""
    b, n, w = (hint(d) for d in values)
    if b * (n * taps + hint(out[1])) * w < SCATTER_THREADED:
        return ScatterWalk.SERIAL
    return ScatterWalk.PLANES if b >= SCATTER_PLANES else ScatterWalk.ROW_RANGES


def _lower_epilogue(
    graph: Graph, node: str, rest: frozenset[str], out: str, more: tuple[str, ...] = ()
) -> tuple[list[Stmt], str, set[str], tuple[Store, ...]] | None:
    """(statements, result var, buffers loaded, stores of `more`) of `out` at one element of
    `out`'s shape (the loop space), or None when `out` is not the contraction's value there
    (another layout, a read at another element). The contraction's coordinates are those of the
    same flat index, which stay linear when `out` is a reshape that splits or merges dims (Linear
    on 3-D input). Only the GEMM template stores other dtypes than fp32 (any the statement
    renderer stores); conv and attention write float. Each of `more` (further outputs, GEMM only)
    must have `out`'s shape: it is stored at the same element, its statements shared with `out`'s."""
    shape = graph[node].tensor_type.shape
    out_t = graph[out].tensor_type
    any_dtype = graph[node].op is Op.MATMUL or out_t.dtype in (DType.F32, graph[node].tensor_type.dtype)
    if not any_dtype or numel(out_t.shape) != numel(shape):
        return None
    sizes = dict(enumerate(out_t.shape))
    lw = _EpilogueLowerer(graph, set(rest), sizes, None)
    oc = tuple(Lin() if s == 1 else Lin.var(Var(d)) for d, s in enumerate(out_t.shape))
    cc = oc if same(out_t.shape, shape) else expr.unflatten(expr.row_major(oc, out_t.shape), shape, sizes)
    cc = tuple(Lin() if s == 1 else c for c, s in zip(cc, shape, strict=True))
    lw._memo[(node, cc)] = "v"  # the accumulator: what the template holds at this element
    if any(not same(graph[o].tensor_type.shape, out_t.shape) for o in more):
        return None
    try:
        result = lw.value(out, oc)
        values = [lw.value(o, oc) for o in more]
    except Unsupported:
        return None
    if node in lw.loaded:  # read at another element than the one being finished
        return None
    flat = expr.row_major(oc, out_t.shape)
    stores = tuple(Store(o, flat, r, graph[o].tensor_type.dtype) for o, r in zip(more, values, strict=True))
    return lw.stmts, result, lw.loaded, stores


def _register_tile(graph: Graph, node: str, unit: VectorUnit) -> Tile:
    """The micro-kernel's mr x nr for the contraction's output matrix (conv: channels of a group x pixels)."""
    n = graph[node]
    shape = n.tensor_type.shape
    if n.op in ATTENTION:
        return attention_tile(unit)
    if n.op is Op.CONV2D and folded_conv(n.attrs, *(graph[i].tensor_type.shape for i in n.inputs), shape):
        m, cols, _ = folded_mnk(*(graph[i].tensor_type.shape for i in n.inputs), shape, n.attrs["groups"])
        return pick_micro_tile(m, cols, unit)  # one GEMM over all images (schedule/conv_fold.py)
    if n.op is Op.CONV2D:
        # At OH x OW columns, not the direct conv's padded width: a tile that fits the padded width of a
        # small plane exactly would hide the weight re-reads the cost model does not price (library_choice).
        direct = direct_conv(n.attrs, graph[n.inputs[1]].tensor_type.shape)
        return pick_micro_tile(shape[1] // n.attrs["groups"], shape[2] * shape[3], unit, direct_conv=direct)
    return pick_micro_tile(shape[-2], shape[-1], unit)


def plan_contraction(graph: Graph, nodes: tuple[str, ...], outputs: tuple[str, ...], gid: int, label: str,
                     caches: Caches, unit: VectorUnit = AVX512,
                     dtypes: frozenset[DType] = FP32_ONLY) -> ContractionPlan:  # fmt: skip
    """How one contraction group runs natively (raises Unsupported for the torch path), its register
    tile chosen for `unit` (the target's vector width and registers); `dtypes`: the contraction
    dtypes the backend's templates take (C++: fp32; Triton: `GPU_DTYPES`)."""
    node, prologue, rest = _split(graph, nodes)
    _check_types(graph, node, dtypes)
    op = graph[node].op
    ops = _Operands(graph, prologue)
    trans_b = swapped = False
    if op is Op.MATMUL:
        trans_b = _gemm_operands(graph, node, ops)
    elif op is Op.CONV2D:
        swapped = _conv_operands(graph, node, ops, dtypes is not GPU_DTYPES)
    elif op in ATTENTION:
        _sdpa_operands(graph, node, ops, dtypes)
    elif op is Op.SCATTER_ADD:
        for i in graph[node].inputs:
            ops.add(i)
    else:
        raise Unsupported(f"no template for {op.value}")
    # A bias gradient the planner put in the group (fusion/columns.py) is no epilogue value.
    cs, rest, outputs = split_column_sum(graph, node, rest, outputs)
    if op is Op.SCATTER_ADD:
        fused = _reshaped(graph, node, rest, outputs)
    else:
        fused = None if op in NO_EPILOGUE else _fuse(graph, node, rest, outputs, prologue, dtypes is GPU_DTYPES)
    out, stmts, result, extras, stores = fused if fused else (node, [], "v", set(), ())
    colsum = column_store(graph, node, cs, out, result, stores) if fused and dtypes is not GPU_DTYPES else None
    tile = _register_tile(graph, node, unit)
    attrs = _template_attrs(graph, node, ops, unit, tile, cpu=dtypes is not GPU_DTYPES, swapped=swapped)
    kernel = ContractionKernel(
        f"k{gid}_c", gid, label, op, node, tuple(ops.names), tuple(ops.shapes), graph[node].tensor_type.shape,
        graph[out].tensor_type.shape, out, tuple(stmts), result, tuple(sorted(extras | ops.loads)),
        attrs, trans_b, caches, tuple(ops.prologues), unit.lanes, *tile,
        # Not for symbolic sizes: the persistent region sits past the arena's intermediates, so
        # it would move with the size (ir/sym.py; the runtime shares one arena across sizes).
        prepacked_b=dtypes is not GPU_DTYPES and _packed_once(graph, op, attrs, ops)
        and not any(is_sym(d) for s in ops.shapes for d in s),
        blocks=_attention_blocks(graph, node, unit, caches) if op in ATTENTION else (64, 64),
        scatter=scatter_walk(ops.shapes[0], graph[node].tensor_type.shape, graph[node].attrs["taps"])
        if op is Op.SCATTER_ADD else None,
        stores=stores,
        colsum=colsum,
    )  # fmt: skip
    if dtypes is not GPU_DTYPES:  # the C++ templates' cache blocks and other blocks (schedule/blocks.py)
        kernel = transposed_a_blocks(template_blocks(kernel, tile, unit), tile, unit)
    # Split: the leftover kernels recompute the (cheap) prologue values they read, and store
    # those other groups read, as torch used to leave them in its env. A column sum not in the
    # template runs after it, as its own row kernel.
    rest_nodes = frozenset() if fused else rest | prologue
    if cs is not None and colsum is None:
        rest_nodes |= cs.nodes
    return ContractionPlan(tuple(dict.fromkeys(ops.copies)), prologue, kernel, rest_nodes)


def _reshaped(
    graph: Graph, node: str, rest: frozenset[str], outputs: tuple[str, ...]
) -> tuple[str, list[Stmt], str, set[str], tuple[Store, ...]] | None:
    """A template without an epilogue whose group only reshapes its value into the one output
    stores there directly (the same bytes), saving a copy of the whole output."""
    if len(outputs) != 1:
        return None
    v, chain = outputs[0], set()
    while v in rest and graph[v].op is Op.RESHAPE:
        chain.add(v)
        v = graph[v].inputs[0]
    return (outputs[0], [], "v", set(), ()) if v == node and chain == set(rest) else None


def _attention_blocks(graph: Graph, node: str, unit: VectorUnit, caches: Caches) -> tuple[int, int]:
    n = graph[node]
    first = 1 if n.op is Op.SDPA_BACKWARD else 0
    q, v = graph[n.inputs[first]].tensor_type.shape, graph[n.inputs[first + 2]].tensor_type.shape
    return attention_blocks(unit, q[-1], v[-1], caches[1])


def _fuse(
    graph: Graph,
    node: str,
    rest: frozenset[str],
    outputs: tuple[str, ...],
    prologue: frozenset[str],
    triton: bool = False,
) -> tuple[str, list[Stmt], str, set[str], tuple[Store, ...]] | None:
    """(output, statements, result, extras, stores) when the whole epilogue fits in the template
    (`triton`: the Triton templates, whose attention epilogue may read other buffers too)."""
    several = graph[node].op is Op.MATMUL and not triton  # the C++ GEMM stores more values (`stores`)
    if not outputs or (len(outputs) > 1 and not several) or any(o not in rest | {node} for o in outputs):
        return None
    # Prologue values the epilogue reads (views, casts) are recomputed inline from their buffers.
    lowered = _lower_epilogue(graph, node, rest | prologue, outputs[0], outputs[1:])
    if lowered is None:
        return None
    stmts, result, extras, stores = lowered
    if graph[node].op is Op.SDPA and extras and not triton:
        return None  # the C++ attention kernel's signature has no room for extra buffers
    return outputs[0], stmts, result, extras, stores


def library_choice(
    graph: Graph, cost: Cost, cp: ContractionPlan, efficiency: Efficiency = Efficiency()
) -> ContractionChoice:
    """The cost model's template-or-library verdict for a planned GEMM or conv group of planner
    cost `cost` (`fusion/library.py`; `efficiency`: the target's library rates over the templates'); attention
    against torch's fused SDPA, except with vfuse's dropout mask and in training's forms (templates)."""
    k, epilogue, out = cp.kernel, bool(cp.kernel.epilogue) or bool(cp.rest), hint(graph[cp.kernel.node].type.nbytes)
    ahead = producers_s(cp.prologue, graph, bandwidth_of(cost))  # torch runs them op by op: RoPE, a mask, casts
    if k.op is Op.SDPA and not sdpa_dropout(k.attrs):
        return choose(cost, 1.0, out, epilogue, efficiency.for_attention(), ahead)
    if k.op in ATTENTION:
        return ContractionChoice(0.0, math.inf)
    if k.op is Op.SCATTER_ADD:  # eager's walk (no tile to pad): the call and the lost fusion decide
        return choose(cost, 1.0, out, bool(cp.rest), producers=ahead)
    shape = k.out_shape
    if k.op is Op.CONV2D and folded_conv(k.attrs, k.shapes[0], k.shapes[1], shape):
        m, n, _ = folded_mnk(k.shapes[0], k.shapes[1], shape, k.attrs["groups"])  # a weight gradient: images folded
        return choose(cost, tile_waste(hint(m), hint(n), k.mr, k.nr), out, epilogue, efficiency, ahead)
    if k.op is Op.CONV2D:
        m = shape[1] // k.attrs["groups"]
        n = conv_columns(k.attrs, k.shapes[0], k.shapes[1], k.out_shape, k.vector, k.nr)
    else:
        m, n = shape[-2], shape[-1]
    m, n = hint(m), hint(n)  # a cost figure: at a symbolic size's hint
    waste = tile_waste(m, n, k.mr, k.nr) * n / (hint(shape[-2] * shape[-1]) if k.op is Op.CONV2D else n)
    if k.op is Op.CONV2D:
        # The direct conv's own tile order (AVX2 4x24) can fit a small plane's columns exactly (8x8: 72 =
        # 3 x 24) while its weights are re-read from L2 per sliver, which the model does not price (128 ->
        # 128 channels at 8x8: 1.35x eager's time). The verdict keeps the waste of the tile the GEMM order
        # picks at OH x OW columns (the choice before the direct conv had its own order), if larger.
        cols = hint(shape[-2] * shape[-1])
        waste = max([waste] + [tile_waste(m, n, *t) * n / cols for t in gemm_order_tiles(m, cols, k.vector)])
    return choose(cost, waste, out, epilogue, efficiency, ahead)


def _template_attrs(
    graph: Graph, node: str, ops: _Operands, unit: VectorUnit, tile: Tile, cpu: bool, swapped: bool
) -> Any:
    """The node's attrs with the schedule's template choices the renderer reads: a folded weight
    gradient, operands read in place, a direct conv's compact columns."""
    attrs, out_shape = graph[node].attrs, graph[node].tensor_type.shape
    conv = graph[node].op is Op.CONV2D and cpu
    if conv and folded_conv(attrs, *ops.shapes, out_shape):
        attrs = attrs.replace(folded=True)  # the weight-gradient template renders it (schedule/conv_fold.py)
    elif conv and compact_columns(attrs, *ops.shapes[:2], out_shape, unit.lanes, tile[1]):
        attrs = attrs.replace(compact=True)  # the direct conv computes no garbage columns (conv_direct.py)
    return attrs.replace(swapped=True) if swapped else attrs  # swapped: read in place
