"""Arena planning: liveness intervals of intermediates and first-fit offsets, 64-byte aligned.

An intermediate lives from the kernel that writes it to the last kernel or torch step that
reads it; two intermediates share arena bytes when their intervals do not overlap. A kernel's
inputs and outputs are live at the same step, so a kernel never writes over what it reads,
except where `reuse_in_place` made it store a value over one it reads for the last time, each
element after its reads of it (as Inductor reuses a dying input's buffer): such a value takes
the other's bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import sympy

from vfuse.ir import Graph
from vfuse.ir.sym import hint, is_sym, proved, same, smax
from vfuse.schedule.kernel import Kernel, Load, MemoryPlan, Segment, Step, Store, Walk

# Walks whose renderers read each element where the statements say, nothing ahead of the store
# (the same as schedule/inplace.py's for graph inputs written in place).
_PLAIN_WALKS = (Walk.SINGLE_ROW, Walk.ROWS, Walk.ROW_GROUPS, Walk.TILED_COLUMNS)

ALIGN = 64
# Over symbolic sizes an offset past several buffers nests Max expressions, and proofs over them
# grow exponentially (a dynamic fuzz program's 2400-node offset: a minute per bound in sympy). Past
# this many operations a buffer goes after all placed so far: their sizes' sum bounds every end.
MAX_OFFSET_OPS = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _ops(x: Any) -> int:
    return sympy.count_ops(x.expr) if is_sym(x) else 0


def _hints(clash: tuple[Any, Any]) -> tuple[int, int]:
    return hint(clash[0]), hint(clash[1])


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


def _stmts(k: Kernel) -> list:
    """The statements in the order each row runs them: passes (per-row, then per-element), tail."""
    return [s for p in k.passes for s in (*p.before, *p.body)] + list(k.after)


def _same_bytes(a: Any, b: Any) -> bool:
    """Types whose dense buffers are interchangeable: one dtype and as many elements, shapes
    aside (a view's reshape: SwiGLU's backward stores d_gate [123, 131] over g [3, 41, 131]);
    the same flat index then names the same bytes."""
    return a == b or (a.dtype == b.dtype and same(a.nbytes, b.nbytes))


def _reusable(k: Kernel, dying: set[str], born: set[str], graph: Graph) -> dict[str, str]:
    """Values `k` stores (first written here) -> a value it reads for the last time, of the same
    dtype and size, whose every load in `k` reads the stored element (same index) before the store."""
    if k.parts or k.walk not in _PLAIN_WALKS or k.transpose or k.table:
        return {}
    stmts = _stmts(k)
    out: dict[str, str] = {}
    for at, st in enumerate(stmts):
        if not isinstance(st, Store) or st.buf not in born or st.buf in out:
            continue
        if sum(isinstance(s, Store) and s.buf == st.buf for s in stmts) != 1:
            continue
        if any(isinstance(s, Load) and s.buf == st.buf for s in stmts):
            continue
        for x in sorted(dying - set(out.values())):
            loads = [(i, s) for i, s in enumerate(stmts) if isinstance(s, Load) and s.buf == x]
            same = _same_bytes(graph[x].tensor_type, graph[st.buf].tensor_type)
            if same and loads and all(i < at and s.index == st.index for i, s in loads):
                out[st.buf] = x
                break
    return out


def _renamed(k: Kernel, mine: Mapping[str, str]) -> Kernel:
    """`k` storing each value of `mine` into the value it takes the bytes of: one pointer for
    the loads and the store (two `__restrict` pointers to the same bytes would be undefined)."""

    def one(s):
        return dataclasses.replace(s, buf=mine[s.buf]) if isinstance(s, Store) and s.buf in mine else s

    passes = tuple(
        dataclasses.replace(p, before=tuple(map(one, p.before)), body=tuple(map(one, p.body))) for p in k.passes
    )
    buffers = tuple(b for b in k.buffers if b not in mine)
    placement = {n: place for n, place in k.placement.items() if n not in mine}
    return dataclasses.replace(k, passes=passes, after=tuple(map(one, k.after)), buffers=buffers, placement=placement)


def reuse_in_place(graph: Graph, steps: list[Step], values: set[str]) -> tuple[list[Step], dict[str, str]]:
    """Plain kernels that store an arena value elementwise over an arena value they read for the
    last time store it there (`_reusable`); returns the steps and value -> the value whose
    bytes it takes (for `plan_memory`)."""
    live = liveness(graph, steps, values)
    shared: dict[str, str] = {}
    out: list[Step] = []
    pos = 0
    for step in steps:
        if not isinstance(step, Segment):
            out.append(step)
            pos += 1
            continue
        kernels = []
        for k in step.kernels:
            if isinstance(k, Kernel):
                mine = set(k.buffers) & values
                dying = {v for v in mine if live[v][1] == pos}
                born = {v for v in mine if live[v][0] == pos}
                found = _reusable(k, dying - born, born, graph)
                if found:
                    k = _renamed(k, found)
                    shared.update(found)
            kernels.append(k)
            pos += 1
        out.append(dataclasses.replace(step, kernels=tuple(kernels)))
    return out, shared


def plan_memory(
    graph: Graph, steps: list[Step], values: set[str], shared: Mapping[str, str] | None = None
) -> MemoryPlan:
    """First-fit placement, largest buffers first among those alive at once. `shared`: value ->
    value whose bytes it takes (`reuse_in_place`): placed once, live from the first's start to
    the last's end."""
    shared = shared or {}

    def root(v: str) -> str:
        while v in shared:
            v = shared[v]
        return v

    live: dict[str, tuple[int, int]] = {}
    for v, (lo, hi) in liveness(graph, steps, values).items():
        r = root(v)
        a, b = live.get(r, (lo, hi))
        live[r] = (min(a, lo), max(b, hi))
    # The order is a heuristic: by size hints, so that symbolic sizes take no guard here (an
    # ordering guard would compile the graph again at every size that reorders the buffers).
    order = sorted(live, key=lambda v: (-hint(graph[v].tensor_type.nbytes), live[v][0], v))
    placed: list[tuple[int, int, tuple[int, int]]] = []  # (offset, size, interval)
    offsets: dict[str, int] = {}
    stacked = 0  # the sizes placed so far: no placed buffer ends past it
    for v in order:
        size = _align(max(graph[v].tensor_type.nbytes, 1))
        lo, hi = live[v]
        # By the hints: comparing symbolic offsets would guard on their order (compiling again
        # wherever it flips).
        clashes = sorted(((o, s) for o, s, (a, b) in placed if a <= hi and lo <= b), key=_hints)
        offset = 0
        # Symbolic sizes (ir/sym.py): a gap is taken only where it is proved large enough at every
        # size, before every clash still ahead, and offsets past several buffers are Max
        # expressions: the plan takes no guard.
        for i, (o, s) in enumerate(clashes):
            if _ops(offset) > MAX_OFFSET_OPS:
                offset = stacked
                break
            if all(proved(offset + size, "<=", o2) for o2, _ in clashes[i:]):
                break
            offset = smax(offset, o + s)
        offsets[v] = offset if _ops(offset) <= MAX_OFFSET_OPS else stacked
        placed.append((offsets[v], size, (lo, hi)))
        stacked = stacked + size
    for v in shared:
        offsets[v] = offsets[root(v)]
    total = 0
    for o, s, _ in placed:
        total = smax(total, o + s) if _ops(total) <= MAX_OFFSET_OPS else stacked
    naive = sum(_align(max(graph[v].tensor_type.nbytes, 1)) for v in offsets)
    return MemoryPlan(offsets, total, naive)
