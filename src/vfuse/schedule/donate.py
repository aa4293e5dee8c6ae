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
from collections.abc import Collection

from vfuse.ir import Graph
from vfuse.schedule.kernel import BufKind, ContractionKernel, MemoryPlan, Program, Segment, TorchStep
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


def donate_outputs(program: Program, graph: Graph, donors: Collection[str]) -> Program:
    """`program` with `donated` set: (output, donor input, byte offset in the donor) for each output
    stored into a donor's bytes (module doc). `donors`: names of graph inputs that may be reused."""
    if not donors or program.in_place or program.symbols:
        return program
    first, last, torch_touched = _spans(program, graph)
    free: dict[str, int] = {}  # donor -> bytes it offers
    for x in donors:
        b = program.buffers.get(x)
        if b is None or b.kind is not BufKind.INPUT or x in torch_touched or x in graph.outputs:
            continue
        size = b.type.nbytes
        if isinstance(size, int) and size >= ALIGN:
            free[x] = size
    used = dict.fromkeys(free, 0)
    outputs = [
        v
        for v, b in program.buffers.items()
        if b.kind is BufKind.OUTPUT and v in first and v not in torch_touched and isinstance(b.type.nbytes, int)
    ]
    outputs.sort(key=lambda v: (-program.buffers[v].type.nbytes, first[v], v))
    done: list[tuple[str, str, int]] = []
    for v in outputs:
        need = _align(max(program.buffers[v].type.nbytes, 1))
        fits = [x for x in free if last.get(x, -1) < first[v] and free[x] - used[x] >= need]
        if not fits:
            continue
        x = min(fits, key=lambda d: (free[d] - used[d], d))  # best fit: the tightest donor
        done.append((v, x, used[x]))
        used[x] += need
    if not done:
        return program
    return dataclasses.replace(program, donated=tuple(done))


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
