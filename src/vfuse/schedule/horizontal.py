"""The kernels of a horizontal group (`fusion/horizontal.py`) joined into one `Walk.HORIZONTAL` kernel.

A horizontal group's pointwise nests (one per output shape, each recomputing what it needs from
the group's inputs, so none reads another's stores) are decided as if alone, then become the
`parts` of one kernel. Parts big enough to fork threads keep their own parallel loops; the
others are spread over the threads, one part per thread at a time, when together they are big
enough (`Kernel.threaded`), so a hundred small parameter updates no longer run one after another
on one core. The joined kernel also carries every part's passes, so what reads a kernel's loads
and stores (memory plan, report, profiler) sees them all.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from vfuse.ir import Graph, Op
from vfuse.schedule.kernel import AnyKernel, Compute, Kernel, TorchStep, Walk
from vfuse.schedule.strategy import PARALLEL_MIN

LABEL = "horizontal"  # fusion.horizontal.LABEL (the schedule reads the plan's labels only)
INT_DIVISIONS = (Op.FLOOR_DIV, Op.REMAINDER, Op.FMOD, Op.DIV)


def components(graph: Graph, nodes: set[str], outputs: list[str]) -> list[list[str]]:
    """The group's outputs in independent sets, one nest each: outputs whose computations read
    a common tensor (numel > 1) from outside the group share a set (a parameter's new value and
    its state), scalar outputs form one set. One nest per output shape instead put every
    same-shaped parameter in one loop of 7 memory streams each, 12x slower than eager at four."""
    parent = {o: o for o in outputs}

    def find(o: str) -> str:
        while parent[o] != o:
            parent[o] = parent[parent[o]]
            o = parent[o]
        return o

    owner: dict[str, str] = {}
    scalars = [o for o in outputs if graph[o].tensor_type.numel <= 1]
    for o in outputs:
        if o in scalars:
            continue
        for leaf in _leaves(graph, nodes, o):
            if leaf in owner:
                parent[find(o)] = find(owner[leaf])
            owner.setdefault(leaf, o)
    sets: dict[str, list[str]] = {}
    for o in outputs:
        if o not in scalars:
            sets.setdefault(find(o), []).append(o)
    return [*sets.values(), *([scalars] if scalars else [])]


def computed_by(graph: Graph, nodes: set[str], outputs: list[str]) -> set[str]:
    """The group nodes computing `outputs` (what torch runs when their nest cannot be lowered)."""
    seen: set[str] = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        if v in nodes and v not in seen:
            seen.add(v)
            stack += graph[v].inputs
    return seen


def _leaves(graph: Graph, nodes: set[str], out: str) -> set[str]:
    """The tensors (numel > 1) that computing `out` inside the group reads from memory."""
    seen, leaves, stack = set(), set(), [out]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in nodes:
            stack += graph[v].inputs
        elif graph[v].tensor_type.numel > 1:
            leaves.add(v)
    return leaves


def join_horizontal(items: Sequence[AnyKernel | TorchStep]) -> list[AnyKernel | TorchStep]:
    """`items` with the joinable kernels of each horizontal group replaced by one kernel, where
    the group's first kernel was (a group's kernels are consecutive)."""
    out: list[AnyKernel | TorchStep] = []
    pending: list[Kernel] = []
    for it in [*items, None]:
        if pending and (it is None or not _joins(it) or it.group != pending[0].group):  # type: ignore[union-attr]
            out.append(joined(pending) if len(pending) > 1 else pending[0])
            pending = []
        if it is None:
            break
        if _joins(it):
            pending.append(it)  # type: ignore[arg-type]
        else:
            out.append(it)
    return out


def _joins(it: AnyKernel | TorchStep) -> bool:
    """A plain pointwise nest of a horizontal group that cannot fault (a fault returns from the
    kernel, which a part inside a parallel region cannot)."""
    if not isinstance(it, Kernel) or it.label != LABEL or it.walk is not Walk.SINGLE_ROW:
        return False
    if it.outer or any(p.reduces for p in it.passes) or it.stream or it.table or it.checks:
        return False
    stmts = [s for p in it.passes for s in (*p.before, *p.body)] + list(it.after)
    return not any(isinstance(s, Compute) and s.op in INT_DIVISIONS and not s.dtype.is_float for s in stmts)


def joined(parts: Sequence[Kernel], tail: Sequence[Kernel] = ()) -> Kernel:
    """One kernel running `parts`, then `tail` (`Kernel.tail`): threaded when the unthreaded
    parts are more than one and together reach the element count that pays for forking threads."""
    small = [p for p in parts if not p.threaded]
    work = sum(math.prod(lp.size for lp in (*p.outer, *p.inner)) for p in small)
    every = [*parts, *tail]
    placement = {k: v for p in every for k, v in p.placement.items()}
    return dataclasses.replace(
        every[0],
        outer=(),
        inner=(),
        passes=tuple(ps for p in every for ps in p.passes),
        after=tuple(s for p in every for s in p.after),
        buffers=tuple(dict.fromkeys(b for p in every for b in p.buffers)),
        placement=placement,
        walk=Walk.HORIZONTAL,
        threaded=len(small) > 1 and work >= PARALLEL_MIN,
        parts=tuple(every),
        tail=len(tail),
    )
