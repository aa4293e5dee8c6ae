"""Graph outputs written straight into the memory of the graph inputs they replace.

An optimizer step or BatchNorm's running statistics end in `copy_(input, new value)`: the capture
keeps such mutations in the graph and hands the new values over as graph outputs, each paired
with the input it replaces (`entry/mutations.py`). Instead of a fresh output the caller copies
into the input afterwards (a second pass over every parameter and state tensor), the kernel that
computes the value stores it into the input's buffer, as Inductor does. Only where no read of the
input's old value can come after the write:

- every other kernel or torch step that reads the input runs before the writing kernel;
- the writing kernel is a plain nest (no template, lookup table or transposed tiles), and each of
  its loads of the input reads the element the store writes (the same index) before the store,
  in the kernel's statement order (passes in order, then the per-row tail);
- in a horizontal kernel, a part that reads the input runs before the part that writes it: a
  writing part whose input another part reads (AdamW's step counter, read by every parameter's
  bias correction) moves to the kernel's tail (`Kernel.tail`), run after all the others;
- no torch step reads the new value, and one kernel stores it, once.

The writing kernel's store and its later loads of the value name the input, so they go through
one pointer (two `__restrict` pointers to the same bytes would be undefined behaviour); other
kernels reading the value keep its name, a buffer bound to the input's pointer slot. Pairs left
out keep their fresh output. `Program.in_place` lists the pairs done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from vfuse.ir import Graph, Kind, Op
from vfuse.schedule.horizontal import joined
from vfuse.schedule.kernel import (
    AnyKernel,
    Buffer,
    BufKind,
    ContractionKernel,
    Kernel,
    Load,
    Program,
    Segment,
    Store,
    TorchStep,
    Walk,
)

# Walks whose renderers read each element where the statements say, nothing ahead of the store.
PLAIN_WALKS = (Walk.SINGLE_ROW, Walk.ROWS, Walk.ROW_GROUPS, Walk.TILED_COLUMNS)


def write_in_place(program: Program, graph: Graph, pairs: Mapping[str, str]) -> Program:
    """`pairs`: graph output value -> the graph input (value name) it is the new value of.
    Returns `program` with the pairs it can write in place done and listed in `in_place`."""
    # An empty value has nothing to write: done as it is, whether or not a kernel "stores" it.
    empty = {v: x for v, x in pairs.items() if _empty(graph, v, x, pairs)}
    pairs = {v: x for v, x in pairs.items() if v not in empty and _eligible(program, graph, v, x, pairs)}
    program = _tail_writers(program, pairs)
    done = {v: x for v, x in pairs.items() if _safe(program, graph, v, x)}
    if done:
        program = _apply(program, graph, done)
    if empty:
        program = dataclasses.replace(program, in_place=(*program.in_place, *empty.items()))
    return program


def _empty(graph: Graph, v: str, x: str, pairs: Mapping[str, str]) -> bool:
    if v not in graph or x not in graph or graph[x].op is not Op.INPUT or graph[v].tensor_type != graph[x].tensor_type:
        return False
    unique = graph.outputs.count(v) == 1 and x not in graph.outputs and list(pairs.values()).count(x) == 1
    return unique and graph[v].tensor_type.numel == 0


def _eligible(program: Program, graph: Graph, v: str, x: str, pairs: Mapping[str, str]) -> bool:
    """What the graph and the buffers say: a kernel-stored output of the input's type, returned
    once, the input not returned itself and replaced by one value only."""
    if v not in graph or x not in graph or graph[x].op is not Op.INPUT or graph[v].kind is Kind.SOURCE:
        return False
    b = program.buffers.get(v)
    if b is None or b.kind is not BufKind.OUTPUT or graph[v].tensor_type != graph[x].tensor_type:
        return False
    if graph.outputs.count(v) != 1 or x in graph.outputs or list(pairs.values()).count(x) != 1:
        return False
    torch_reads = {i for s in program.steps if isinstance(s, TorchStep) for n in s.nodes for i in graph[n].inputs}
    return v not in torch_reads and len(_writers(program, v)) == 1


def _writers(program: Program, v: str) -> list[tuple[int, Kernel]]:
    """(position, kernel or horizontal part) of every store of `v`, a store per entry."""
    out = []
    for pos, k in enumerate(_flat(program)):
        if isinstance(k, ContractionKernel):
            if v in k.written:
                out.append((pos, k))  # type: ignore[arg-type]  # rejected by _safe
            continue
        if isinstance(k, Kernel):
            for part in k.parts or (k,):
                out += [(pos, part) for s in _stmts(part) if isinstance(s, Store) and s.buf == v]
    return out


def _flat(program: Program) -> list[AnyKernel | TorchStep]:
    """Kernels and torch steps in execution order."""
    return [k for s in program.steps for k in (s.kernels if isinstance(s, Segment) else (s,))]


def _stmts(k: Kernel) -> list:
    """The kernel's statements in the order each row runs them: passes (per-row, then
    per-element), then the per-row tail."""
    return [s for p in k.passes for s in (*p.before, *p.body)] + list(k.after)


def _reads(item: AnyKernel | TorchStep, x: str, graph: Graph) -> bool:
    if isinstance(item, TorchStep):
        return any(x in graph[n].inputs for n in item.nodes)
    return x in item.buffers


def _tail_writers(program: Program, pairs: Mapping[str, str]) -> Program:
    """Horizontal kernels with their writing parts whose input another part reads moved to the tail."""
    inputs_of: dict[str, set[str]] = {}
    for v, x in pairs.items():
        (_, part), *_ = _writers(program, v)
        inputs_of.setdefault(part.name, set()).add(x)
    steps = []
    for s in program.steps:
        if isinstance(s, Segment):
            s = dataclasses.replace(s, kernels=tuple(_with_tail(k, inputs_of) for k in s.kernels))
        steps.append(s)
    return dataclasses.replace(program, steps=tuple(steps))


def _with_tail(k: AnyKernel, inputs_of: Mapping[str, set[str]]) -> AnyKernel:
    if not isinstance(k, Kernel) or k.walk is not Walk.HORIZONTAL or k.tail:
        return k
    tail = [p for p in k.parts if any(x in q.buffers for x in inputs_of.get(p.name, ()) for q in k.parts if q is not p)]
    if not tail:
        return k
    rest = [p for p in k.parts if p not in tail]
    return dataclasses.replace(joined(rest, tail), name=k.name)


def _safe(program: Program, graph: Graph, v: str, x: str) -> bool:
    """Whether no read of `x`'s old value can come after `v` is stored into it (module doc)."""
    (pos, part), *_ = _writers(program, v)
    if not isinstance(part, Kernel) or part.walk not in PLAIN_WALKS or part.transpose or part.table:
        return False
    items = _flat(program)
    if any(_reads(it, x, graph) for it in items[pos + 1 :]):
        return False
    writer = items[pos]
    if writer is not part and not _parts_before(writer, part, x):  # type: ignore[arg-type]
        return False
    stmts = _stmts(part)
    at = next(i for i, s in enumerate(stmts) if isinstance(s, Store) and s.buf == v)
    store = stmts[at]
    loads = [(i, s) for i, s in enumerate(stmts) if isinstance(s, Load) and s.buf == x]
    return all(i < at and s.index == store.index for i, s in loads)


def _parts_before(k: Kernel, writer: Kernel, x: str) -> bool:
    """In horizontal kernel `k`, every other part reading `x` finishes before part `writer` runs:
    tail parts run after all the others, in order; threaded parts run first, together (their
    loops share one parallel region without barriers); the other parts follow, one after
    another unless spread over the threads."""
    head, tail = k.parts[: len(k.parts) - k.tail], k.parts[len(k.parts) - k.tail :]
    order = [p for p in head if p.threaded] + [p for p in head if not p.threaded]
    for p in k.parts:
        if p is writer or x not in p.buffers:
            continue
        if writer in tail:
            if p in tail and tail.index(p) > tail.index(writer):
                return False
            continue
        if p in tail or order.index(p) > order.index(writer) or (p.threaded and writer.threaded):
            return False
        if not p.threaded and not writer.threaded and k.threaded:
            return False  # spread over the threads: no order between them
    return True


def _apply(program: Program, graph: Graph, done: Mapping[str, str]) -> Program:
    buffers = dict(program.buffers)
    slots = [b.slot for b in buffers.values() if b.kind in (BufKind.INPUT, BufKind.OUTPUT)]
    for v, x in done.items():
        if x not in buffers:  # an input no kernel read: it gets a pointer slot now
            buffers[x] = Buffer(x, graph[x].tensor_type, BufKind.INPUT, max(slots, default=-1) + 1)
            slots.append(buffers[x].slot)
        buffers[v] = Buffer(v, buffers[v].type, BufKind.INPUT, buffers[x].slot)
    steps = []
    for s in program.steps:
        if isinstance(s, Segment):
            kernels = tuple(_renamed(k, done) for k in s.kernels)
            s = _with_io(dataclasses.replace(s, kernels=kernels), buffers, done)
        steps.append(s)
    return dataclasses.replace(program, steps=tuple(steps), buffers=buffers, in_place=tuple(done.items()))


def _renamed(k: AnyKernel, done: Mapping[str, str]) -> AnyKernel:
    """The writing part's stores of each value, and its loads of it, name the input instead."""
    if not isinstance(k, Kernel):
        return k
    if k.parts:
        parts = tuple(_renamed(p, done) for p in k.parts)
        if parts == k.parts:
            return k
        return dataclasses.replace(
            k,
            parts=parts,
            passes=tuple(ps for p in parts for ps in p.passes),
            after=tuple(s for p in parts for s in p.after),
            buffers=tuple(dict.fromkeys(b for p in parts for b in p.buffers)),
            placement={n: place for p in parts for n, place in p.placement.items()},
        )
    mine = {v: x for v, x in done.items() if any(isinstance(s, Store) and s.buf == v for s in _stmts(k))}
    if not mine:
        return k

    def one(s):
        if isinstance(s, Load | Store) and s.buf in mine:
            return dataclasses.replace(s, buf=mine[s.buf])
        return s

    passes = tuple(
        dataclasses.replace(p, before=tuple(map(one, p.before)), body=tuple(map(one, p.body))) for p in k.passes
    )
    buffers = tuple(dict.fromkeys(mine.get(b, b) for b in k.buffers))
    placement = {mine.get(n, n): place for n, place in k.placement.items()}
    prefetch = k.prefetch
    if prefetch is not None:
        loads = tuple(dataclasses.replace(pl, load=one(pl.load)) for pl in prefetch.loads)
        prefetch = dataclasses.replace(prefetch, loads=loads)
    return dataclasses.replace(
        k, passes=passes, after=tuple(map(one, k.after)), buffers=buffers, placement=placement, prefetch=prefetch
    )


def _with_io(seg: Segment, buffers: Mapping[str, Buffer], done: Mapping[str, str]) -> Segment:
    """The segment's pointer-table values: what it reads (a value written in place: its input)
    and the inputs it writes; its outputs without the values written in place."""
    touched = {done.get(b, b) for k in seg.kernels for b in k.buffers}
    ins = sorted(b for b in touched if buffers[b].kind not in (BufKind.ARENA, BufKind.OUTPUT))
    ins += sorted(b for b in seg.inputs if buffers[b].kind is BufKind.OUTPUT and b not in ins)
    outs = tuple(b for b in seg.outputs if b not in done)
    return dataclasses.replace(seg, inputs=tuple(sorted(ins)), outputs=outs)
