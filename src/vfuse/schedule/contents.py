"""What a scheduled kernel computes, in IR terms: the values it stores and the IR nodes between
its loads and its stores. Kernels do not list their nodes (`schedule/lower.py` lowers by demand
from the stores); the report and the profiler price exactly these nodes with the cost model."""

from __future__ import annotations

from vfuse.ir import Graph, Kind
from vfuse.schedule.kernel import AnyKernel, ContractionKernel, Store


def stored(kernel: AnyKernel) -> tuple[str, ...]:
    """The values a kernel writes to memory."""
    if isinstance(kernel, ContractionKernel):
        return kernel.written
    stores = [s for p in kernel.passes for s in p.body if isinstance(s, Store)]
    stores += [s for s in kernel.after if isinstance(s, Store)]
    return tuple(dict.fromkeys(s.buf for s in stores))


def computed(graph: Graph, kernel: AnyKernel) -> tuple[str, ...]:
    """The IR nodes a kernel computes, in graph order: from its stores back to what it loads."""
    outs = stored(kernel)
    loaded = set(kernel.buffers) - set(outs)
    seen: set[str] = set()
    stack = list(outs)
    while stack:
        v = stack.pop()
        if v in seen or v in loaded or graph[v].kind is Kind.SOURCE:
            continue
        seen.add(v)
        stack += graph[v].inputs
    return tuple(n.name for n in graph.nodes if n.name in seen)
