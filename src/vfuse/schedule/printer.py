"""Readable text of a Program for dumps and the report (05_program.txt)."""

from __future__ import annotations

from vfuse.schedule.kernel import AnyKernel, ContractionKernel, Loop, Program, Segment, TorchStep


def _loops(loops: tuple[Loop, ...]) -> str:
    def one(lp: Loop) -> str:
        tags = [t for t, on in (("par", lp.parallel), ("simd", lp.vector)) if on]
        return f"i{lp.var}<{lp.size}" + (f"[{','.join(tags)}]" if tags else "")

    return " ".join(one(lp) for lp in loops) or "-"


def format_kernel(k: AnyKernel) -> str:
    if isinstance(k, ContractionKernel):
        layout = " (B transposed)" if k.trans_b else ""
        ins = ", ".join(f"%{v}{list(s)}" for v, s in zip(k.operands, k.shapes, strict=True))
        epi = f"epilogue {len(k.epilogue)} stmt(s)" + (f" reading {', '.join(k.extras)}" if k.extras else "")
        return f"  kernel {k.name} (group {k.group}, {k.label}): {k.op.value}({ins}){layout} -> %{k.out}; {epi}"
    lines = [f"  kernel {k.name} (group {k.group}, {k.label}): outer {_loops(k.outer)} | inner {_loops(k.inner)}"]
    for n, p in enumerate(k.passes):
        red = ", ".join(f"{r.op.value}({r.arg})->{r.var}" for r in p.reduces)
        extra = []
        if p.buffered:
            extra.append(f"row buffer <- {', '.join(p.buffered)}")
        if p.reloaded:
            extra.append(f"reload {', '.join(p.reloaded)}")
        lines.append(
            f"    pass {n}: {len(p.before)} per-row, {len(p.body)} per-element"
            + (f", reduce {red}" if red else "")
            + (f"; {'; '.join(extra)}" if extra else "")
        )
    return "\n".join(lines)


def format_program(program: Program) -> str:
    lines = ["program {"]
    for s in program.steps:
        if isinstance(s, Segment):
            lines.append(f" segment {s.name}: in ({', '.join(s.inputs)}) out ({', '.join(s.outputs)})")
            lines += [format_kernel(k) for k in s.kernels]
        elif isinstance(s, TorchStep):
            lines.append(f" torch (group {s.group}, {s.label}): {', '.join(s.nodes)}  # {s.reason}")
    mem = program.memory
    lines.append(f" arena {mem.size} bytes (without reuse {mem.naive_bytes})")
    for v, off in sorted(program.memory.offsets.items(), key=lambda t: t[1]):
        lines.append(f"   {off:>10}  %{v} {program.buffers[v].type}")
    lines.append("}")
    return "\n".join(lines)
