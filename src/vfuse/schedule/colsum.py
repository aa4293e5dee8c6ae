"""A GEMM group's column sum (`fusion/columns.py`) as the template's `ContractionKernel.colsum`.

The planner put a bias gradient `sum(dH, 0)` (and reshapes of it) into the GEMM group writing
dH. Here it is taken out of the epilogue before lowering, then attached to the kernel when the
epilogue is fused into the template and stores dH at fp32 (the sum adds that stored value per
column). Otherwise its nodes go back to the ordinary kernels run after the contraction: the row
kernel the planner would have made without the pass.
"""

from __future__ import annotations

from vfuse.fusion.columns import ColumnSum, column_sum, gemm_columns
from vfuse.ir import DType, Graph, Op
from vfuse.ir.sym import is_sym
from vfuse.schedule.expr import Lin
from vfuse.schedule.kernel import Store


def split_column_sum(
    graph: Graph, node: str, rest: frozenset[str], outputs: tuple[str, ...]
) -> tuple[ColumnSum | None, frozenset[str], tuple[str, ...]]:
    """(the group's column sum or None, the epilogue without it, the outputs without it)."""
    if graph[node].op is not Op.MATMUL or not any(graph[n].op is Op.SUM for n in rest):
        return None, rest, outputs
    sums = {n for n in rest if graph[n].op is Op.SUM}
    chain = [n.name for n in graph if n.name in sums or (n.name in rest and sums & graph.ancestors(n.name, rest))]
    written = tuple(o for o in outputs if o in chain)
    cs = column_sum(graph, chain, written)
    if cs is None:
        return None, rest, outputs
    return cs, rest - cs.nodes, tuple(o for o in outputs if o not in cs.nodes)


def column_store(
    graph: Graph, node: str, cs: ColumnSum | None, out: str, result: str, stores: tuple[Store, ...]
) -> Store | None:
    """The kernel's `colsum` for a fused epilogue writing `out` (its value in `result`) and
    `stores`, or None when the summed value is not one of them at fp32, or sizes are symbolic."""
    if cs is None or not gemm_columns(graph, (node,), cs.value):
        return None
    if any(is_sym(d) for d in graph[node].tensor_type.shape) or graph[out].tensor_type.dtype is not DType.F32:
        return None
    if cs.value == out:
        return Store(cs.out, Lin(), result, DType.F32)
    var = next((s.arg for s in stores if s.buf == cs.value), None)
    return None if var is None else Store(cs.out, Lin(), var, DType.F32)
