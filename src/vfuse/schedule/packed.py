"""Which GEMMs a CPU torch step gives torch's packed-weight GEMM: a MATMUL whose B is a constant
(a frozen weight, through its transpose) and whose A is a static 2-D fp32 matrix. The runtime packs
such a weight once (`runtime/steps.py`: MKL's packed sgemm, what Inductor's frozen linear calls) instead
of handing the plain matrix to every call: a 256 x 1024 x 256 GEMM 345 -> 306 us, 256 x 256 x 1024
346 -> 292 us (Xeon, 2 threads, session 27)."""

from __future__ import annotations

from collections.abc import Sequence

from vfuse.ir import DType, Graph, Op, TensorType
from vfuse.ir.sym import is_sym

# Ops between a constant and the GEMM's B that keep it one fixed matrix (no data of their own).
_WEIGHT_VIEWS = frozenset({Op.PERMUTE, Op.RESHAPE})


def constant_weight(graph: Graph, value: str) -> bool:
    """Whether `value` is a constant seen through views only (its data known before any call)."""
    node = graph[value]
    while node.op in _WEIGHT_VIEWS:
        node = graph[node.inputs[0]]
    return node.op is Op.CONSTANT


def _static_matrix(t: object) -> bool:
    return isinstance(t, TensorType) and t.dtype is DType.F32 and t.rank == 2 and not any(is_sym(d) for d in t.shape)


def packed_gemms(graph: Graph, nodes: Sequence[str]) -> tuple[str, ...]:
    """The MATMUL nodes among `nodes` (one torch step's) whose weight the runtime packs once."""
    out = []
    for n in nodes:
        node = graph[n]
        if node.op is not Op.MATMUL or len(node.inputs) != 2:
            continue
        a, b = (graph[i].type for i in node.inputs)
        if _static_matrix(a) and _static_matrix(b) and constant_weight(graph, node.inputs[1]):
            out.append(n)
    return tuple(out)
