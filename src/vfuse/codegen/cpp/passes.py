"""One pass of a kernel over its row: the per-row statements, then the loop nest over the row
with its reductions accumulated as the schedule decided (`Pass.reduction`, `Pass.serial`,
`Pass.streamed`): plain SIMD, lanes (`lanes.py`), strips (`strips.py`), in order (index
reductions), or a streamed store loop (`streaming.py`)."""

from __future__ import annotations

import dataclasses

from vfuse.codegen.cpp.lanes import render_lanes
from vfuse.codegen.cpp.streaming import render_streamed, serial_copy
from vfuse.codegen.cpp.strips import render_strips
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.schedule.kernel import Accumulate, Loop, Pass, Range, Residue

PARALLEL = "num_threads(nt) schedule(static)"
BLOCKED = (Accumulate.SIMD, Accumulate.LANES, Accumulate.STRIPS)


def render_pass(w: KernelWriter, p: Pass) -> None:
    for s in p.before:
        w.stmt(s)
    w.begin_pass(p)
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_acc")
    if not w.k.inner:
        w.body(p, "_acc")
    elif p.streamed:
        render_streamed(w, p)
    else:
        _nest(w, p)
    for r in p.reduces:
        w.finish(r)
    w.end_pass()


def _nest(w: KernelWriter, p: Pass) -> None:
    *rest, vec = w.k.inner
    par = [lp for lp in rest if lp.parallel and not p.serial]
    at = w.mark()
    if par:
        collapse = f" collapse({len(par)})" if len(par) > 1 else ""
        w.w(f"#pragma omp parallel for {PARALLEL}{collapse} {w.clauses(p.reduces, '_acc')}")
    for lp in rest:
        w.open_loop(lp)
    vec_par = vec.parallel and not p.serial
    if p.reduction.kind in BLOCKED:
        _blocked(w, p, vec, vec_par)
    elif p.residue is not None:
        _residue(w, p, vec, p.residue)
    elif p.ranges:
        for r in p.ranges:
            _range(w, p, vec, r)
    else:
        for start, end, interior in _pieces(p, vec):
            if p.reduction.kind is not Accumulate.IN_ORDER:
                w.w(f"#pragma omp {f'parallel for simd {PARALLEL}' if vec_par else 'simd'}")
            w.open_loop(vec, str(start), str(end))
            w.unclamped = vec.var if interior else None
            w.body(p, "_acc")
            w.unclamped = None
            w.close()
    w.close(len(rest))
    if par:
        serial_copy(w, at)


def _range(w: KernelWriter, p: Pass, vec: Loop, r: Range) -> None:
    """One range of a SIMD loop split at a CAT's pieces (schedule/peel.py): only the picked
    inputs are read; with `r.block`, a loop over block starts around the SIMD loop, whose div /
    mod of the loop var the indices take once per block (`expr.within`)."""
    v = w.names[vec.var]
    if r.block:
        b = f"{v}b"
        w.names[r.block_var] = b
        w.open(f"for (int64_t {b} = {r.lo}; {b} < {r.hi}; {b} += {r.block}) {{")
    w.w("#pragma omp simd")
    w.open_loop(vec, f"{b}" if r.block else str(r.lo), f"{b} + {r.block}" if r.block else str(r.hi))
    w.range = (vec.var, r)
    w.body(p, "_acc")
    w.range = None
    w.close(2 if r.block else 1)


def _residue(w: KernelWriter, p: Pass, vec: Loop, r: Residue) -> None:
    """The schedule's residue split (schedule/residue.py): per phase of the enclosing loop (one
    branch each, when split), per range of q, a SIMD loop over q whose body is the `stride`
    copies (each in its own scope: they declare the same values); then the tail of v past the
    last whole group, unsplit."""
    q = f"{w.names[vec.var]}q"
    w.names[r.qvar] = q
    for a in range(r.row_stride):
        if r.row_stride > 1:
            row = w.names[r.row]
            w.open(f"{'if' if a == 0 else 'else if'} ({row} % {r.row_stride} == {a}) {{")
            w.names[r.rvar] = f"{row}r"
            w.w(f"const int64_t {row}r = {row} / {r.row_stride};")
        copies = r.bodies[a * r.stride : (a + 1) * r.stride]
        for piece in r.pieces:
            w.w("#pragma omp simd")
            w.open(f"for (int64_t {q} = {piece[0].lo}; {q} < {piece[0].hi}; ++{q}) {{")
            for body, rng in zip(copies, piece[a * r.stride : (a + 1) * r.stride], strict=True):
                w.open("{")
                w.range = (r.qvar, rng)
                w.body(dataclasses.replace(p, body=body), "_acc")
                w.range = None
                w.close()
            w.close()
        if r.row_stride > 1:
            w.close()
    if r.stride * r.groups != vec.size:
        w.open_loop(vec, str(r.stride * r.groups))
        w.body(p, "_acc")
        w.close()


def _pieces(p: Pass, vec: Loop) -> list[tuple[object, object, bool]]:
    """The SIMD loop's ranges: the whole loop, or the schedule's peel (border, interior without
    the index clamps, border), empty borders left out."""
    if p.peel is None:
        return [(0, vec.size, False)]
    lo, hi = p.peel
    pieces = [(0, lo, False), (lo, hi, True), (hi, vec.size, False)]
    return [(a, b, inner) for a, b, inner in pieces if inner or a != b]


def _blocked(w: KernelWriter, p: Pass, vec: Loop, parallel: bool) -> None:
    """A SIMD reduction loop in blocks whose partials are then combined (split between threads
    when `parallel`), or, for lanes over a row that is one block, the lanes alone."""
    red = p.reduction
    if red.kind is Accumulate.LANES and red.whole_row:
        w.open("{")
        w.w(f"const int64_t rb = 0, re = {vec.size};")
        render_lanes(w, p, vec, "_acc")
        w.close()
        return
    at = w.mark()
    if parallel:
        w.w(f"#pragma omp parallel for {PARALLEL} {w.clauses(p.reduces, '_acc')}")
    w.open(f"for (int64_t rb = 0; rb < {vec.size}; rb += {red.block}) {{")
    w.w(f"const int64_t re = rb + {red.block} < {vec.size} ? rb + {red.block} : {vec.size};")
    for r in p.reduces:
        w.declare_acc(r, f"{r.var}_blk")
    if red.kind is Accumulate.LANES:
        render_lanes(w, p, vec, "_blk")
    elif red.kind is Accumulate.STRIPS:
        render_strips(w, p, vec, min(vec.size, red.block))
    else:
        w.w(f"#pragma omp simd {w.clauses(p.reduces, '_blk')}")
        w.open_loop(vec, "rb", "re")
        w.body(p, "_blk")
        w.close()
    for r in p.reduces:
        w.combine(r, f"{r.var}_blk")
    w.close()
    if parallel:
        serial_copy(w, at)
