"""Render a schedule `Program` as one C++ translation unit.

Each kernel is a `static` function rendered by the renderer of its walk (`RENDERERS`, keyed by
`Kernel.walk`); every choice of how to walk, vectorize, prefetch or stream was made by the
schedule (`schedule/strategy.py`) and is read from the kernel's fields. What each op, dtype
and reduction becomes is in `rules.py`. Each native segment gets an `extern "C"` entry
`int seg(void* const* bufs, char* arena, const int64_t* seeds, int nt)` that runs its kernels
in order (bufs: the program's pointer table of inputs, outputs and torch-made tensors; arena:
intermediates, then the fault record; seeds: RNG_SEED values; nt: OpenMP threads) and returns
0, or the code of a fault (`faults.py`). A profiled Program adds `seg_prof(..., int64_t* ns)`
per segment, which also writes each kernel's time (`function.render_profiled_entry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vfuse.codegen.cpp.columns import render_tiled
from vfuse.codegen.cpp.contraction import render_contraction
from vfuse.codegen.cpp.function import SIGNATURE, kernel_function, render_entry, render_profiled_entry
from vfuse.codegen.cpp.horizontal import render_horizontal
from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.rowgroups import render_row_groups
from vfuse.codegen.cpp.rows import render_rows, render_single_row
from vfuse.codegen.cpp.shared import share_bodies
from vfuse.codegen.cpp.table import render_table
from vfuse.codegen.cpp.transpose import render_transpose
from vfuse.codegen.cpp.units import ENTRIES, PART
from vfuse.codegen.cpp.writer import KernelWriter
from vfuse.ir.sym import CPP_PREFIX, SymSize, free_symbols
from vfuse.schedule.kernel import ContractionKernel, Kernel, Program, Walk

KernelRenderer = Callable[[Kernel, Program], str]


def _walking(body: Callable[[KernelWriter], None]) -> KernelRenderer:
    """A renderer writing a plain kernel function whose body `body` writes."""
    return lambda k, program: kernel_function(KernelWriter(k, program), body)


RENDERERS: dict[Walk, KernelRenderer] = {
    Walk.SINGLE_ROW: _walking(render_single_row),
    Walk.ROWS: _walking(render_rows),
    Walk.ROW_GROUPS: _walking(render_row_groups),
    Walk.TILED_COLUMNS: _walking(render_tiled),
    Walk.LOOKUP_TABLE: render_table,
    Walk.HORIZONTAL: render_horizontal,
    Walk.TILED_TRANSPOSE: render_transpose,
}


def render_kernel(kernel: Kernel, program: Program) -> str:
    if kernel.at_hint is not None:
        return hint_copy(kernel, program)
    return at_hint(kernel, program, RENDERERS[kernel.walk](kernel, program))


def hint_copy(k: Kernel, program: Program) -> str:
    """A kernel with a copy scheduled at its row length's hint (`Kernel.at_hint`,
    schedule/rowhint.py): both functions, and `k` running the copy in calls of those sizes."""
    assert k.at_hint is not None
    copy = dataclasses.replace(k.at_hint.kernel, name=f"{k.name}_hint")
    generic = dataclasses.replace(k, name=f"{k.name}_any", at_hint=None)
    test = " && ".join(f"{CPP_PREFIX}{s} == {h}" for s, h in k.at_hint.sizes)
    dispatch = [
        f"static void {k.name}{SIGNATURE} {{  // the copy scheduled at the row length's hint: {test}",
        f"  if ({test}) {copy.name}(bufs, arena, seeds, nt);",
        f"  else {generic.name}(bufs, arena, seeds, nt);",
        "}",
    ]
    return "\n".join([render_kernel(copy, program), render_kernel(generic, program), *dispatch])


# Walks much faster when their rows' length is a compile-time constant: a tiled transpose at a
# run-time row length ran 17% slower (256x512, quick transpose_add; a row walk's softmax 3%).
# In a symbolic program such a kernel is rendered twice, at the hint of the length and for any,
# and each call takes the one its sizes fit: no guard, both exact at every size.
VERSIONED_WALKS = (Walk.TILED_TRANSPOSE,)


def at_hint(k: Kernel, program: Program, text: str) -> str:
    """`text` (kernel `k`'s function) or, for a versioned walk whose innermost loop has a
    symbolic length, `k` dispatching between a copy at the length's hint and the generic one."""
    loops = (*k.outer, *k.inner)
    last = loops[-1].size if loops else 0
    head = f"static void {k.name}{SIGNATURE}"
    if k.walk not in VERSIONED_WALKS or not isinstance(last, SymSize) or text.count(head) != 1:
        return text
    slots = {s: i for i, s in enumerate(program.symbols)}
    used = sorted((s.name, last.env.hints[s]) for s in free_symbols([last]))
    fixed = "\n".join(f"#undef {CPP_PREFIX}{s}\n#define {CPP_PREFIX}{s} ((int64_t){h})" for s, h in used)
    generic = "\n".join(f"#undef {CPP_PREFIX}{s}\n{define(program, slots[s])}" for s, _ in used)
    test = " && ".join(f"{CPP_PREFIX}{s} == {h}" for s, h in used)
    dispatch = [
        f"{head} {{  // the copy of its sizes' length: {test}",
        f"  if ({test}) {k.name}_hint(bufs, arena, seeds, nt);",
        f"  else {k.name}_any(bufs, arena, seeds, nt);",
        "}",
    ]
    copy = text.replace(head, f"static void {k.name}_hint{SIGNATURE}")
    return "\n".join([fixed, copy, generic, text.replace(head, f"static void {k.name}_any{SIGNATURE}"), *dispatch])


# The TU is built with -ffp-contract=off, as Inductor's: a contracted `x*x - sum` is not the 0
# eager computes (a variance of one element came out inf, not NaN). The contraction templates'
# micro-kernels are written as vector `a * b + c` and want FMA: contraction is on for them alone.
CONTRACT_FMA = '#pragma GCC push_options\n#pragma GCC optimize("fp-contract=fast")'
CONTRACT_END = "#pragma GCC pop_options"


def symbol_defines(program: Program) -> list[str]:
    """`vf_s0` and the other symbolic sizes: read from the seeds array every kernel and entry
    takes (after the RNG seeds), so a kernel's loops take the call's sizes (ir/sym.py)."""
    return ["\n".join(define(program, i) for i in range(len(program.symbols)))] if program.symbols else []


def define(program: Program, i: int) -> str:
    """The macro reading symbol `i` of `program` (after the RNG seeds in `seeds`)."""
    return f"#define {CPP_PREFIX}{program.symbols[i]} (seeds[{len(program.seeds) + i}])"


def render(program: Program) -> str:
    """The whole translation unit: prelude, template instances (GEMM / conv / attention, each
    include-guarded or namespaced), every kernel, one entry per segment. Each kernel's parts
    and the entries start with a `units.PART` comment, where the toolchain may split the text
    into units that compile in parallel (`units.py`)."""
    parts, kernels = [PRELUDE, *symbol_defines(program)], []
    for k in program.kernels:
        if isinstance(k, ContractionKernel):
            template, wrapper = render_contraction(k, program)
            parts.append(f"{PART}{k.name}\n{CONTRACT_FMA}\n{template}\n{CONTRACT_END}")
            kernels.append((k.name, wrapper))
        else:
            kernels.append((k.name, render_kernel(k, program)))
    # A layer's kernels repeated in the next layer compile once (`shared.py`).
    parts += [f"{PART}{name}\n{text}" for (name, _), text in zip(kernels, share_bodies(kernels), strict=True)]
    parts += [f"{PART}{ENTRIES}", *(render_entry(seg, program) for seg in program.segments)]
    if program.profiled:
        parts += ["#include <time.h>", *(render_profiled_entry(seg, program) for seg in program.segments)]
    return "\n\n".join(parts) + "\n"
