"""fp8 (`DType.F8E4M3`, `F8E5M2`) in kernels, and fp8 GEMMs on the GPU's fp8 tensor cores.

Kernels read fp8 buffers (and views of them) and widen them exactly: every fp8 value is an fp32,
bf16 and fp16 value. Rounding to fp8 (a cast to fp8, a quantize) and storing fp8 stay in torch:
its conversion (ties to even; on CPU in torch 2.13 e4m3fn saturates at 448, e5m2 overflows to
inf) is neither Triton's `cvt` (saturating both) nor the interpreter's. The C++ renderer has no
fp8 loads, so on CPU targets a group's nodes that give or read fp8 run in torch (`fp8_split`: a
counted `TorchStep`, the rest of the group, a GEMM on the widened values included, still
compiled).

`with_fp8_dot`: a GPU MATMUL of `(a8.to(f32) * sa) @ (b8.to(f32) * sb)` (batched or broadcast
as the template takes them, B's transpose read in place as `trans_b`, reshapes of A read in
place, scales per tensor: a python float or a one-element fp32 buffer, or none; without scales
the cast may also be to bf16 / fp16) reads the fp8 buffers straight into `tl.dot` and
multiplies the fp32 accumulator by sa * sb before the epilogue: `sum_k (a_k sa)(b_k sb) =
sa sb sum_k a_k b_k`, exact up to fp32 rounding (products of fp8 values are exact in fp32). A
bf16 / fp16 cast followed by a scale rounds the scaled operand to bf16 in eager, which folding
would skip: that operand keeps its per-tile prologue (widened, scaled, rounded, the
contraction's dtype on the tensor cores), as does every other prologue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vfuse.fusion.plan import Group
from vfuse.ir import DType, Graph, Kind, Node, Op, TensorType
from vfuse.ir.shapes import numel
from vfuse.ir.sym import same
from vfuse.schedule.kernel import ContractionKernel, Fp8Dot

# Layout ops: an fp8 value they give is still read from its buffer through an index map.
_VIEWS = frozenset({Kind.SOURCE, Kind.BROADCAST, Kind.INJECTIVE})


def _any_fp8(d: DType) -> bool:
    return d.is_fp8


def _fp8(graph: Graph, v: str, which: Callable[[DType], bool] = _any_fp8) -> bool:
    t = graph[v].type
    return isinstance(t, TensorType) and which(t.dtype)


def _touching(graph: Graph, g: Group, which: Callable[[DType], bool]) -> list[str]:
    """The nodes of `g` giving or reading a value of a dtype `which` accepts."""
    return [n for n in g.nodes if any(_fp8(graph, v, which) for v in (n, *graph[n].inputs))]


def fp8_split(
    graph: Graph, g: Group, triton: bool, e4m3: bool = True
) -> tuple[tuple[str, ...], Group | None, str] | None:
    """Where fp8 values keep part of group `g` in torch: (the nodes torch runs, in order, with their
    in-group inputs; the rest of the group, or None; why), or None when no fp8 value needs it. On
    the C++ backend every node giving or reading an fp8 value goes; on Triton every fp8 value
    computed (not a view) or stored, and without `e4m3` (sm_80: Triton has no e4m3 type there,
    not even for a pointer) every node giving or reading e4m3."""
    seeds, why = _touching(graph, g, _any_fp8), "fp8 values (the C++ backend has no fp8 type)"
    if triton:
        seeds = [n for n in g.nodes if _fp8(graph, n) and (graph[n].kind not in _VIEWS or n in g.outputs)]
        why = "fp8 computed or stored (rounding to fp8 stays in torch)"
        if not seeds and not e4m3:
            seeds, why = _touching(graph, g, lambda d: d is DType.F8E4M3), "e4m3 on a GPU before sm_89"
    if not seeds:
        return None
    why = f"%{seeds[0]}: {why}"
    members, side, stack = set(g.nodes), set(), list(seeds)
    while stack:
        n = stack.pop()
        if n not in side:
            side.add(n)
            stack += [i for i in graph[n].inputs if i in members]
    nodes = tuple(n for n in g.nodes if n not in side)
    outputs = tuple(o for o in g.outputs if o not in side)
    rest = dataclasses.replace(g, nodes=nodes, outputs=outputs, inputs=(*g.inputs, *sorted(side))) if outputs else None
    return tuple(n for n in g.nodes if n in side), rest, why


@dataclasses.dataclass(frozen=True)
class _Widened:
    buf: str  # the fp8 buffer
    scale: float | str  # a literal, or a one-element fp32 buffer
    transposed: bool  # the operand is the buffer's transpose
    shape: tuple[int, ...]  # the shape the template reads the buffer as (row-major, the same bytes)


def with_fp8_dot(k: ContractionKernel, graph: Graph, fp8_cores: bool) -> ContractionKernel:
    """`k` reading its fp8 operands as they are, where both have that form and the target has
    fp8 tensor cores (`fp8_cores`); otherwise `k` unchanged (its prologues widen per tile)."""
    if not fp8_cores or k.op is not Op.MATMUL or len(k.prologues) != 2 or None in k.prologues:
        return k
    a, b = graph[k.node].inputs
    dtype = graph[k.node].tensor_type.dtype
    loads = [set(p.loads) for p in k.prologues if p is not None]
    wa, wb = _widened(graph, a, dtype, loads[0]), _widened(graph, b, dtype, loads[1])
    if wa is None or wb is None or wa.transposed:
        return k
    shapes = (wa.shape, wb.shape)
    # `extras` keep the prologues' loads: the fp8 buffers (also operands now) and the scales.
    return dataclasses.replace(
        k,
        operands=(wa.buf, wb.buf),
        shapes=shapes,
        prologues=(None, None),
        trans_b=wb.transposed,
        fp8=Fp8Dot((wa.scale, wb.scale)),
    )


def _widened(graph: Graph, v: str, dtype: DType, loads: set[str]) -> _Widened | None:
    """`v` as [transpose of] cast(fp8 buffer) [* per-tensor scale], the buffer and scale among
    `loads` (read by the operand's prologue, so not computed in the group). Without a transpose,
    reshapes anywhere in the chain are the same bytes (Linear on 3-D input: `view` of the cast):
    the buffer is read as `v`'s shape."""
    node, transposed, scale = _through_reshapes(graph, v), False, 1.0
    if _is_transpose(graph, node.name):
        transposed, node = True, graph[node.inputs[0]]
    if node.op is Op.MUL:
        for inner, factor in (node.inputs, node.inputs[::-1]):
            s = _scale(graph, factor, loads)
            if s is not None and graph[inner].op is Op.CAST:
                scale, node = s, graph[inner]
                break
        else:
            return None
        if dtype is not DType.F32:
            return None  # eager rounds the scaled operand to bf16 / fp16: keep the prologue
    if node.op is not Op.CAST or node.tensor_type.dtype is not dtype:
        return None
    src = _through_reshapes(graph, node.inputs[0]).name
    if _is_transpose(graph, src):
        transposed, src = not transposed, graph[src].inputs[0]
    shape = tuple(graph[v].tensor_type.shape)
    if transposed:
        shape = (*shape[:-2], shape[-1], shape[-2])
        chain_reshaped = graph[v].op is Op.RESHAPE or graph[node.inputs[0]].op is Op.RESHAPE
        if chain_reshaped or not same(graph[src].tensor_type.shape, shape):
            return None  # a transpose reads the buffer as its own shape, swapped
    if not _fp8(graph, src) or src not in loads:
        return None
    return _Widened(src, scale, transposed, shape)


def _through_reshapes(graph: Graph, v: str) -> Node:
    node = graph[v]
    while node.op is Op.RESHAPE:
        node = graph[node.inputs[0]]
    return node


def _is_transpose(graph: Graph, v: str) -> bool:
    """`v` swaps the last two dims of its input (and no other)."""
    n = graph[v]
    if n.op is not Op.PERMUTE:
        return False
    r = len(n.attrs["perm"])
    return r >= 2 and tuple(n.attrs["perm"]) == (*range(r - 2), r - 1, r - 2)


def _scale(graph: Graph, v: str, loads: set[str]) -> float | str | None:
    """A per-tensor scale: a FULL's value, or a one-element fp32 buffer the prologue reads."""
    n = graph[v]
    t = n.tensor_type
    if t.dtype is not DType.F32 or numel(t.shape) != 1:
        return None
    if n.op is Op.FULL:
        return float(n.attrs["value"])
    return v if v in loads else None
