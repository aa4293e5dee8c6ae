"""Graph outputs placed in the bytes of donated graph inputs the program has finished reading.

A training backward's inputs include the activations the forward saved for it. AOTAutograd lists
those no other tensor aliases as *donated* (`fw_metadata.bw_donated_idxs`): the backward runs once
(a `retain_graph=True` backward raises in AOTAutograd), so their bytes are free once their last
reader has run, and Inductor reuses them. vfuse's backward is one native call that would otherwise
take a fresh buffer for every gradient at its start while every saved activation stays alive to its
end; instead each output whose first writer runs after a donor's last reader is stored into that
donor's bytes (several outputs may share one donor: outputs live to the end, so they are packed
one after another, 64-byte aligned). The C++ does not change: an output is a pointer-table slot;
the executor binds it to the donor's storage at the planned offset and returns a view of it
(`runtime/pool.donated_view`, which checks the donor at run time and falls back to the pool).

Only where no read of the donor's old bytes can come after the write:
- positions are kernels and torch steps in execution order; the donor's last reading kernel comes
  strictly before the output's first writing kernel (a horizontal kernel is one position);
- no torch step touches the donor (its result may be a view that outlives the step) or the output;
- fixed sizes only (offsets are plain integers).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Sequence

from vfuse.ir import Graph
from vfuse.schedule.kernel import (
    AnyKernel,
    BufKind,
    ContractionKernel,
    MemoryPlan,
    Program,
    Segment,
    Store,
    TorchStep,
)
from vfuse.schedule.memory import liveness

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _spans(program: Program, graph: Graph) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """(first position touching each value, last position touching it, values a torch step touches)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    torch_touched: set[str] = set()
    pos = 0
    for step in program.steps:
        if isinstance(step, TorchStep):
            vals = {i for n in step.nodes for i in graph[n].inputs} | set(step.nodes)
            torch_touched |= vals
            groups = [vals]
        else:
            assert isinstance(step, Segment)
            groups = [set(k.buffers) for k in step.kernels]
        for vals in groups:
            for v in vals:
                first.setdefault(v, pos)
                last[v] = pos
            pos += 1
    return first, last, torch_touched


def block_layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Byte offset of each member of a block of tensors, in order, and the block's size: one after
    the other, each 64-byte aligned. The forward returns its donated saved activations so
    (`runtime/pool.OutputPool.group`) and the backward plans its donors' bytes with the same."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += _align(max(n, 1))
    return offsets, end


def _regions(program: Program, graph: Graph, donors: Sequence[str]) -> tuple[list[tuple[str, int, int, float]], int]:
    """The donors' block: (donor, offset, bytes, first position its bytes are free) each, and the
    block's size; a donor a torch step touches or the graph returns is never free."""
    _, last, torch_touched = _spans(program, graph)
    sizes = [graph[x].tensor_type.nbytes for x in donors]
    if not all(isinstance(n, int) for n in sizes):
        return [], 0
    offsets, end = block_layout(sizes)  # type: ignore[arg-type]
    regions = []
    for x, o, n in zip(donors, offsets, sizes, strict=True):
        b = program.buffers.get(x)
        usable = (b is None or b.kind is BufKind.INPUT) and x not in torch_touched and x not in graph.outputs
        regions.append((x, o, int(n), last.get(x, -1) + 1 if usable else math.inf))
    return regions, end


def _place(
    outputs: Sequence[tuple[str, int, int]], regions: Sequence[tuple[str, int, int, float]], end: int, top: bool
) -> list[tuple[str, str, int]]:
    """(output, donor, offset from the donor's start) for each output (name, bytes, first write)
    that fits in donor bytes free from its first write on and not taken: across adjacent donors
    of the block (`regions`, `end`), or within one donor where the block has one. Best fit, or
    with `top` the top of the highest gap: donors die from the block's end down (the backward
    reads the forward's last activations first), so early outputs stacked there leave the
    space below in one piece."""
    block = len(regions) > 1
    taken: list[tuple[int, int]] = []
    done = []
    for v, need, f in outputs:
        busy = sorted([(o, o + _align(n)) for _, o, n, free in regions if free > f] + taken)
        spaces = [(0, end)] if block else [(o, o + n) for _, o, n, free in regions if free <= f]
        gaps = []  # (start, bytes)
        for lo, hi in spaces:
            at = lo
            for a, b in [*busy, (hi, hi)]:
                if b <= at:
                    continue
                if min(a, hi) - at >= need:
                    gaps.append((at, min(a, hi) - at))
                at = max(at, b)
                if at >= hi:
                    break
        if not gaps:
            continue
        if top:
            at, size = max(gaps)
            start = at + size - need
        else:
            start = min(gaps, key=lambda g: (g[1], g[0]))[0]
        x, o, _, _ = max((r for r in regions if r[1] <= start), key=lambda r: r[1])
        done.append((v, x, start - o))
        taken.append((start, start + need))
    return done


def _written(k: AnyKernel) -> set[str]:
    if isinstance(k, ContractionKernel):
        return set(k.written)
    if k.parts:
        return set().union(*(_written(p) for p in k.parts))
    stmts = [*(s for p in k.passes for s in (*p.before, *p.body)), *k.after]
    return {s.buf for s in stmts if isinstance(s, Store)}


def _later(kernels: list[AnyKernel], j: int, program: Program, writes: dict[int, set[str]], free: set[str]) -> int:
    """The index in `kernels` after which kernel j may run instead (j: it stays): after the last
    other kernel touching each value it reads that dies in this segment (`free`), so that none
    lives longer, only its outputs less; and before any kernel writing a value it reads or bytes
    of the arena it reads. `writes`: what each kernel writes, by id."""
    k, offsets = kernels[j], program.memory.offsets
    ins = set(k.buffers) - writes[id(k)]
    q = len(kernels) - 1
    for y in ins & free:
        last = max((i for i, o in enumerate(kernels) if i != j and y in o.buffers), default=-1)
        q = min(q, max(last, j))

    def span(v: str) -> tuple[int, int]:
        return offsets[v], offsets[v] + _align(program.buffers[v].type.nbytes)

    spans = [span(y) for y in ins if y in offsets]
    for i in range(j + 1, q + 1):
        w = writes[id(kernels[i])]
        if w & ins or any(a < hi and lo < b for lo, hi in map(span, w & offsets.keys()) for a, b in spans):
            return max(i - 1, j)
    return q


def _deferred(kernels: list[AnyKernel], program: Program, keep: set[str], outside: set[str], after: set[str]) -> list:
    """`kernels` (one segment) with each that writes only outputs no other step touches moved by
    `_later`, the last first; `outside` / `after`: values the other steps / the later ones touch."""
    outs = {v for v, b in program.buffers.items() if b.kind is BufKind.OUTPUT}
    writes = {id(k): _written(k) for k in kernels}
    count = Counter(v for k in kernels for v in set(k.buffers))
    free = set(count) - keep - after
    for j in range(len(kernels) - 1, -1, -1):
        w = writes[id(kernels[j])]
        if w and w <= outs and not w & outside and all(count[v] == 1 for v in w):
            q = _later(kernels, j, program, writes, free)
            if q > j:
                kernels.insert(q, kernels.pop(j))
    return kernels


def defer_outputs(program: Program, graph: Graph, donors: Sequence[str] = ()) -> Program:
    """`program` with each kernel that writes only graph outputs nothing else reads (a weight's or
    a bias's gradient) moved later in its segment, as far as `_later` allows: a backward computes
    a weight gradient where the values it reads are at hand, but those are often kept alive by
    other readers anyway (the incoming gradient; an activation the attention backward reads
    next), and a gradient written later is live for less of the call: it may land in a donor
    that has died meanwhile rather than in the arena next to the intermediates still to come.
    `donors`: inputs whose bytes free up in the call (not given: a kernel may keep a donor alive
    longer, where its bytes would not have been reused in the meantime anyway)."""
    if program.symbols or program.in_place:
        return program
    kinds = {v: b.kind for v, b in program.buffers.items()}
    keep = {v for v, kind in kinds.items() if kind is BufKind.OUTPUT or (kind is BufKind.INPUT and v not in donors)}
    touched = [
        set().union(*(k.buffers for k in st.kernels))
        if isinstance(st, Segment)
        else {i for n in st.nodes for i in graph[n].inputs} | set(st.nodes)
        for st in program.steps
    ]
    steps = list(program.steps)
    for n, st in enumerate(steps):
        if isinstance(st, Segment) and len(st.kernels) > 1:
            after = set().union(*touched[n + 1 :])
            kernels = _deferred(list(st.kernels), program, keep, set().union(*touched[:n], after), after)
            steps[n] = dataclasses.replace(st, kernels=tuple(kernels))
    return dataclasses.replace(program, steps=tuple(steps))


def donate_outputs(program: Program, graph: Graph, donors: Sequence[str]) -> Program:
    """`program` with `donated` set: (output, donor input, byte offset from the donor's start) for
    each output stored into donor bytes (module doc); with several donors, `donor_block` too: the
    forward returns them in one block, and an output may span adjacent dead donors. `donors`:
    names of graph inputs that may be reused, in the order of the forward's block. The kernels
    that only write outputs run as late as `defer_outputs` allows where that leaves the smaller
    arena."""
    if not donors or program.in_place or program.symbols:
        return program
    variants = (program, defer_outputs(program, graph, donors), defer_outputs(program, graph, ()))
    found = [_placed(p, graph, donors) for p in variants]
    best = min((f for f in found if f is not None), default=None, key=lambda f: f[0])
    return best[1] if best is not None and best[1].donated else program


def _placed(program: Program, graph: Graph, donors: Sequence[str]) -> tuple[tuple[int, int], Program] | None:
    """The placement of `donate_outputs` leaving the smallest arena, with its score (arena bytes,
    minus the bytes placed in donors); None where no donor dies in the call."""
    first, _, torch_touched = _spans(program, graph)
    regions, end = _regions(program, graph, donors)
    if not any(free < math.inf for *_, free in regions):
        return None
    block = len(regions) > 1
    outputs = [
        (v, _align(max(b.type.nbytes, 1)), first[v])
        for v, b in program.buffers.items()
        if b.kind is BufKind.OUTPUT and v in first and v not in torch_touched and isinstance(b.type.nbytes, int)
    ]
    best: tuple[tuple[int, int], Program] | None = None
    # Largest or first written first, best fit or stacked: whichever leaves the smaller arena for
    # the rest (`outputs_in_arena`; a few ms each).
    orders = (lambda o: (-o[1], o[2], o[0]), lambda o: (o[2], -o[1], o[0]))
    for key, top in itertools.product(orders, (False, True)):
        done = _place(sorted(outputs, key=key), regions, end, top)
        layout = {"donor_block": tuple((x, o) for x, o, _, _ in regions), "donor_block_bytes": end} if block else {}
        candidate = dataclasses.replace(program, donated=tuple(done), **layout)  # type: ignore[arg-type]
        placed = {v for v, _, _ in done}
        score = (outputs_in_arena(candidate, graph).memory.size, -sum(n for v, n, _ in outputs if v in placed))
        if best is None or score < best[0]:
            best = (score, candidate)
    return best


def outputs_in_arena(program: Program, graph: Graph) -> Program:
    """`program` with `arena_outputs` set: (output, arena byte offset) for the kernel-written outputs
    no donor took, placed in the arena's bytes no intermediate uses from the output's first write on
    (first fit, largest first), the arena grown where none is free. The arena is then the outputs'
    storage and outlives the call (`runtime/arena_outputs.py`): at the end of a backward, where its
    peak is, the arena is live anyway, so the gradients it holds cost nothing there, where fresh
    buffers taken at the call's start added their bytes to the whole call."""
    if (
        program.symbols
        or program.in_place
        or any(isinstance(k, ContractionKernel) and k.prepacked_b for k in program.kernels)
    ):
        return program
    first, _, torch_touched = _spans(program, graph)
    end = max(first.values(), default=0) + len(program.steps) + 1  # past every position
    offsets = program.memory.offsets
    spans = liveness(graph, list(program.steps), set(offsets))
    placed = [(offsets[v], _align(max(graph[v].tensor_type.nbytes, 1)), spans[v]) for v in offsets if v in spans]
    taken = {v for v, _, _ in program.donated}
    outputs = [
        v
        for v, b in program.buffers.items()
        if b.kind is BufKind.OUTPUT and v in first and v not in taken and v not in torch_touched
    ]
    outputs.sort(key=lambda v: (-program.buffers[v].type.nbytes, first[v], v))
    done: list[tuple[str, int]] = []
    for v in outputs:
        size, lo = _align(max(program.buffers[v].type.nbytes, 1)), first[v]
        offset = 0
        for o, s in sorted((o, s) for o, s, (a, b) in placed if a <= end and lo <= b):
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        done.append((v, offset))
        placed.append((offset, size, (lo, end)))
    if not done:
        return program
    size = max(program.memory.size, max(o + s for o, s, _ in placed))
    memory = MemoryPlan(offsets, size, program.memory.naive_bytes)
    return dataclasses.replace(program, arena_outputs=tuple(done), memory=memory)


def donated_bytes(program: Program) -> int:
    """Bytes of outputs stored into donors (fresh buffers the call no longer takes)."""
    return sum(program.buffers[v].type.nbytes for v, _, _ in program.donated)
