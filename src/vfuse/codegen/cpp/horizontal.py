"""`Walk.HORIZONTAL`: one function running independent pointwise nests (`Kernel.parts`).

Each part is written as the single-row walk writes it alone, in its own scope (its pointers
and variables cannot clash with another part's). Parts that fork threads themselves run first,
their loops shared out in one parallel region without barriers between them; the others
follow, and when the schedule marked the kernel `threaded` they are spread over the threads: a
parallel loop over part numbers, one `case` per part, dynamic so a thread that finishes a small
part takes the next. The `Kernel.tail` parts run last, one after another: they write inputs in
place that the others read (schedule/inplace.py).
"""

from __future__ import annotations

from vfuse.codegen.cpp.function import SIGNATURE
from vfuse.codegen.cpp.passes import PARALLEL
from vfuse.codegen.cpp.rows import render_single_row
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.schedule.kernel import Kernel, Program, Store

PARALLEL_LOOP = f"#pragma omp parallel for simd {PARALLEL}"  # a threaded pointwise nest's loop (passes.py)
SHARED_LOOP = "#pragma omp for simd schedule(static) nowait"


def render_horizontal(k: Kernel, program: Program) -> str:
    lines: list[str] = []
    head, tail = k.parts[: len(k.parts) - k.tail], k.parts[len(k.parts) - k.tail :]
    big = [p for p in head if p.threaded]
    small = [p for p in head if not p.threaded]
    lines += _one_region(big, program) or [line for p in big for line in _scoped(p, program, 1)]
    if k.threaded:
        lines.append("#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)")
        lines.append(f"  for (int vf_part = 0; vf_part < {len(small)}; ++vf_part) {{")
        lines.append("    switch (vf_part) {")
        for i, p in enumerate(small):
            lines.append(f"      case {i}:")
            lines += _scoped(p, program, 4)
            lines.append("        break;")
        lines += ["    }", "  }"]
    else:
        for p in small:
            lines += _scoped(p, program, 1)
    for p in tail:
        lines += _scoped(p, program, 1)
    sizes = ", ".join(_size(p) for p in k.parts)
    doc = f"// group {k.group} ({k.label}): {len(k.parts)} independent nests ({sizes})"
    return "\n".join([doc, f"static void {k.name}{SIGNATURE} {{", *lines, "}"])


def _one_region(big: list[Kernel], program: Program) -> list[str] | None:
    """Parts that fork threads, in one parallel region instead of one each (as Inductor): each
    part's parallel loop becomes a worksharing loop without the barrier after it (`nowait`: the
    parts are independent, so threads go on to the next one; the region's end waits for all).
    None where a part is not one parallel SIMD loop with no store outside it (then each part
    keeps its own region)."""
    if len(big) < 2:
        return None
    inner = []
    for p in big:
        outside = [s for ps in p.passes for s in ps.before] + list(p.after)
        scoped = _scoped(p, program, 2)
        loops = [i for i, line in enumerate(scoped) if line.strip() == PARALLEL_LOOP]
        if any(isinstance(s, Store) for s in outside) or len(loops) != 1 or sum("omp" in x for x in scoped) != 1:
            return None
        scoped[loops[0]] = scoped[loops[0]].replace(PARALLEL_LOOP, SHARED_LOOP)
        inner += scoped
    return ["  #pragma omp parallel num_threads(nt)", "  {", *inner, "  }"]


def _scoped(part: Kernel, program: Program, depth: int) -> list[str]:
    """The part's pointers and walk inside `{ }`, at indentation `depth`."""
    w = KernelWriter(part, program)
    w.pointers()
    render_single_row(w)
    pad = "  " * depth
    return [f"{pad}{{  // {part.name}", *(pad + line for line in w.lines), f"{pad}}}"]


def _size(p: Kernel) -> str:
    return "x".join(str(lp.size) for lp in p.inner) or "1"
