"""Arena planning: liveness intervals of intermediates and first-fit offsets, 64-byte aligned.

An intermediate lives from the kernel that writes it to the last kernel or torch step that
reads it; two intermediates share arena bytes when their intervals do not overlap. A kernel's
inputs and outputs are live at the same step, so a kernel never writes over what it reads.
The arena is allocated once per compiled graph and reused by every call.
"""

from __future__ import annotations

from vfuse.ir import Graph
from vfuse.ir.sym import hint, proved, smax
from vfuse.schedule.kernel import MemoryPlan, Segment, Step

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def liveness(graph: Graph, steps: list[Step], values: set[str]) -> dict[str, tuple[int, int]]:
    """[first, last] position (kernels and torch steps in execution order) of each value."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    pos = 0
    for step in steps:
        touched: list[set[str]]
        if isinstance(step, Segment):
            touched = [set(k.buffers) for k in step.kernels]
        else:
            touched = [{i for n in step.nodes for i in graph[n].inputs} | set(step.nodes)]
        for vals in touched:
            for v in vals & values:
                first.setdefault(v, pos)
                last[v] = pos
            pos += 1
    return {v: (first[v], last[v]) for v in first}


def plan_memory(graph: Graph, steps: list[Step], values: set[str]) -> MemoryPlan:
    """First-fit placement, largest buffers first among those alive at once."""
    live = liveness(graph, steps, values)
    # The order is a heuristic: by size hints, so that symbolic sizes take no guard here (an
    # ordering guard would compile the graph again at every size that reorders the buffers).
    order = sorted(live, key=lambda v: (-hint(graph[v].tensor_type.nbytes), live[v][0], v))
    placed: list[tuple[int, int, tuple[int, int]]] = []  # (offset, size, interval)
    offsets: dict[str, int] = {}
    for v in order:
        size = _align(max(graph[v].tensor_type.nbytes, 1))
        lo, hi = live[v]
        clashes = sorted((o, s) for o, s, (a, b) in placed if a <= hi and lo <= b)
        offset = 0
        # Symbolic sizes (ir/sym.py): a gap is taken only where it is proved large enough at every
        # size, and offsets past several buffers are Max expressions: the plan takes no guard.
        for o, s in clashes:
            if proved(offset + size, "<=", o):
                break
            offset = smax(offset, o + s)
        offsets[v] = offset
        placed.append((offset, size, (lo, hi)))
    total = 0
    for o, s, _ in placed:
        total = smax(total, o + s)
    naive = sum(_align(max(graph[v].tensor_type.nbytes, 1)) for v in live)
    return MemoryPlan(offsets, total, naive)
