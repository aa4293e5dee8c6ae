"""Readable text of a Program for dumps and the report (05_program.txt): every kernel's loops
and passes, and every decision a renderer acts on (`strategy.py`)."""

from __future__ import annotations

from vfuse.ir import Op
from vfuse.ir.sym import hint, pretty
from vfuse.schedule.kernel import (
    Accumulate,
    AnyKernel,
    ContractionKernel,
    GpuLaunch,
    GpuWalk,
    Kernel,
    Loop,
    Pass,
    Program,
    Reduction,
    RowPrefetch,
    Segment,
    TorchStep,
    Walk,
)


def _loops(loops: tuple[Loop, ...]) -> str:
    def one(lp: Loop) -> str:
        tags = [t for t, on in (("par", lp.parallel), ("simd", lp.vector)) if on]
        return f"i{lp.var}<{lp.size}" + (f"[{','.join(tags)}]" if tags else "")

    return " ".join(one(lp) for lp in loops) or "-"


def _walk(k: Kernel) -> str:
    """The kernel-level decisions: walk, threads, and what the walk needs."""
    threads = "threads per call" if k.thread_gate is not None else "threaded" if k.threaded else "one thread"
    parts = [f"walk {k.walk.value}", threads]
    if k.walk is Walk.TILED_COLUMNS:
        parts.append(f"tile {k.tile} columns")
    if k.walk is Walk.ROW_GROUPS:
        held = f", rows held in registers ({k.register_row}-lane vectors) one at a time" if k.register_row else ""
        parts.append(f"{k.row_group} rows per group{held}")
    if k.transpose:
        t = k.transpose
        staged = ", ".join(t.staged)
        pf = ", rows prefetched into L2" if t.prefetch else ""
        parts.append(f"tiles i{t.u} {t.rows} x {t.cols}, {t.block}x{t.block} blocks{pf}, loads transposed: {staged}")
    if k.walk is Walk.LOOKUP_TABLE:
        parts.append(f"table of %{k.table}" + (", one flat loop" if k.table_flat else ""))
    if k.stream:
        parts.append("streamed stores" + (" per call" if k.stream_gate is not None else ""))
    if k.prefetch:
        parts.append(_prefetch(k.prefetch))
    if k.moments:
        parts.append(f"passes 0-1 as one of per-lane moments ({k.moments[0]}-lane vectors, {k.moments[1]} a chunk)")
    if k.tail:
        parts.append(f"last {k.tail} part(s) after the others (they write inputs the others read)")
    return ", ".join(parts)


def _prefetch(pf: RowPrefetch) -> str:
    loads = "; ".join(
        f"%{pl.load.buf} every {pl.step} elements, {' | '.join(f'{lo}:{hi}' for lo, hi in pl.shares)}"
        for pl in pf.loads
    )
    when = " in calls that pass its gate" if pf.gate is not None else ""
    return f"prefetch {pretty(pf.distance)} rows ahead{when} (locality {pf.locality}): {loads}"


def _gpu(g: GpuLaunch) -> str:
    """The GPU launch (`schedule/gpu.py`): walk, tile, warps, grid."""
    if g.walk is GpuWalk.FLAT:
        parts = [f"gpu {g.walk.value}, {g.block} elements per program"]
    else:
        what = "rows" if g.walk is GpuWalk.ROWS else "columns"
        kept = "persistent" if g.persistent else "looped per pass"
        parts = [f"gpu {g.walk.value}, {g.rows} {what} x {g.block} per program ({kept})"]
    parts.append(f"{g.warps} warps, {g.programs} programs")
    if g.walk is GpuWalk.FLAT and g.unmasked:
        parts.append("all mask-free" if g.unmasked == g.programs else f"{g.unmasked} mask-free, the tail masked")
    if g.wide:
        parts.append("64-bit offsets")
    if g.check_block:
        parts.append(f"index checks in blocks of {g.check_block}")
    return ", ".join(parts)


def _reduction(red: Reduction) -> str:
    if red.kind is Accumulate.LANES:
        return f"{red.lanes} lanes" + (", whole row" if red.whole_row else f", block {red.block}")
    if red.kind is Accumulate.STRIPS:
        return f"strips, {red.chains} chain(s) x {red.vector} lanes, block {red.block}"
    if red.kind is Accumulate.SIMD:
        return f"simd, block {red.block}"
    return red.kind.value


def _pass(n: int, p: Pass) -> str:
    red = ", ".join(f"{r.op.value}({r.arg})->{r.var}" for r in p.reduces)
    extra = []
    if p.buffered:
        extra.append(f"row buffer <- {', '.join(p.buffered)}")
    if p.reloaded:
        extra.append(f"reload {', '.join(p.reloaded)}")
    if p.reduces:
        extra.append(f"accumulate {_reduction(p.reduction)}")
    if p.serial:
        extra.append("serial")
    if p.streamed:
        extra.append("streamed" + (f" from registers ({p.stream_lanes} lanes) where aligned" if p.stream_lanes else ""))
    if p.group_columns:
        extra.append(f"group's rows per {p.group_columns}-lane step")
    if p.recips:
        extra.append(f"reciprocal of {', '.join(p.recips)}")
    if p.nonpos:
        extra.append(f"<= 0: {', '.join(p.nonpos)}")
    if p.ranges:  # peel.py: the SIMD loop split at a CAT's pieces
        extra.append("ranges " + " ".join(f"[{r.lo},{r.hi})" + (f"/{r.block}" if r.block else "") for r in p.ranges))
    return (
        f"    pass {n}: {len(p.before)} per-row, {len(p.body)} per-element"
        + (f", reduce {red}" if red else "")
        + (f"; {'; '.join(extra)}" if extra else "")
    )


def format_kernel(k: AnyKernel) -> str:
    if isinstance(k, ContractionKernel):
        layout = " (B transposed)" if k.trans_b else ""
        layout += " (B packed once: constant)" if k.prepacked_b else ""
        ins = ", ".join(f"%{v}{list(s)}" for v, s in zip(k.operands, k.shapes, strict=True))
        epi = f"epilogue {len(k.epilogue)} stmt(s)" + (f" reading {', '.join(k.extras)}" if k.extras else "")
        tile = f"register tile {k.mr}x{k.nr} of {k.vector}-lane vectors"
        if k.op in (Op.SDPA, Op.SDPA_LSE, Op.SDPA_BACKWARD):
            tile += f", tiles of {k.blocks[0]} query rows x {k.blocks[1]} keys"
        if k.scatter is not None:
            tile = f"walk {k.scatter.value}, each element's terms in source order"
        if (q := k.int8) is not None:
            scale = f"%{q.w_scales} per channel" if q.w_scales else f"{q.w_scale!r}"
            tile = (
                f"int8 dot product ({q.kind.value}): (%{q.x} - {q.x_zero}) * {q.x_scale!r} @ "
                f"((%{q.w} - {q.w_zero}) * {scale})^T, int32 tile {q.mr}x{q.nr}"
            )
        outs = ", ".join(f"%{v}" for v in k.written)
        return f"  kernel {k.name} (group {k.group}, {k.label}): {k.op.value}({ins}){layout} -> {outs}; {epi}; {tile}"
    lines = [f"  kernel {k.name} (group {k.group}, {k.label}): outer {_loops(k.outer)} | inner {_loops(k.inner)}"]
    lines.append(f"    {_walk(k)}")
    if k.gpu:
        lines.append(f"    {_gpu(k.gpu)}")
    lines += [_pass(n, p) for n, p in enumerate(k.passes)]
    return "\n".join(lines)


def format_program(program: Program) -> str:
    tier = f"{program.isa.value}, " if program.isa else ""
    lines = [f"program ({tier}vectors of {program.vector_width} fp32 lanes) {{"]
    for s in program.steps:
        if isinstance(s, Segment):
            lines.append(f" segment {s.name}: in ({', '.join(s.inputs)}) out ({', '.join(s.outputs)})")
            lines += [format_kernel(k) for k in s.kernels]
        elif isinstance(s, TorchStep):
            lines.append(f" torch (group {s.group}, {s.label}): {', '.join(s.nodes)}  # {s.reason}")
    if program.in_place:
        lines.append(f" written in place: {', '.join(f'%{v} -> %{x}' for v, x in program.in_place)}")
    if program.donated:
        lines.append(f" stored in donated inputs: {', '.join(f'%{v} -> %{x}+{o}' for v, x, o in program.donated)}")
    if program.arena_outputs:
        lines.append(f" stored in the arena: {', '.join(f'%{v} at {o}' for v, o in program.arena_outputs)}")
    mem = program.memory
    lines.append(f" arena {mem.size} bytes (without reuse {mem.naive_bytes})")
    # Symbolic offsets (ir/sym.py) are ordered by their hints and printed as expressions.
    for v, off in sorted(program.memory.offsets.items(), key=lambda t: hint(t[1])):
        lines.append(f"   {off!s:>10}  %{v} {program.buffers[v].type}")
    lines.append("}")
    return "\n".join(lines)
