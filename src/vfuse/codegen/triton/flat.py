"""Pointwise kernels (`GpuWalk.FLAT`) and the gather-index check kernels.

A FLAT program takes `block` consecutive elements of the flattened nest: full blocks mask-free
where the schedule says so (`GpuLaunch.unmasked`), the tail block masked;
loop variables are div/mod of the flat index, and an index that walks a run of the innermost
loops row-major is written as the flat index itself (`names.IndexWriter`), so the compiler sees
contiguous, aligned accesses (the offsets carry `tl.multiple_of` / `tl.max_contiguous`).
"""

from __future__ import annotations

import math

from vfuse.codegen.triton.names import LoopGroup, param
from vfuse.codegen.triton.writer import FaultKind, FaultTable, TritonWriter
from vfuse.schedule.kernel import IndexCheck, Kernel, Program


def flat_group(k: Kernel) -> LoopGroup:
    return LoopGroup("xf_", k.inner)


def render_flat(w: TritonWriter, k: Kernel) -> None:
    """The body of a FLAT kernel function: mask-free where every program takes a full block
    (`GpuLaunch.unmasked`), else each program masked, or both: the first `unmasked` programs
    mask-free (vector accesses on any element count), the last one masked."""
    g = k.gpu
    assert g is not None
    pid = "tl.program_id(0).to(tl.int64)" if g.wide else "tl.program_id(0)"
    w.w(f"pid_ = {pid}")
    w.w(f"xf_ = tl.max_contiguous(tl.multiple_of(pid_ * {g.block} + tl.arange(0, {g.block}), {g.block}), {g.block})")
    top = w.mark()
    total = math.prod(lp.size for lp in k.inner)
    if 0 < g.unmasked < g.programs:
        w.w(f"if pid_ < {g.unmasked}:")
        w.depth += 1
        _flat_body(w, k, None)
        w.depth -= 1
        w.w("else:")
        w.depth += 1
        _flat_body(w, k, f"xf_ < {total}", after=False)  # program 0, which runs `after`, is mask-free
        w.depth -= 1
    else:
        _flat_body(w, k, None if g.unmasked else f"xf_ < {total}")
    w.insert(top, w.index.take(flat_group(k)))


def _flat_body(w: TritonWriter, k: Kernel, mask: str | None, after: bool = True) -> None:
    """Every pass of `k` under `mask` (None: every lane valid), then `after` once per kernel."""
    w.defined = set()
    if mask is not None:
        w.w(f"m_ = {mask}")
    w.mask = "m_" if mask is not None else None
    for p in k.passes:
        for s in p.before:
            w.emit_with_deps(s)
        w.hoist_recips(p.recips)
        for s in p.body:
            w.emit_with_deps(s)
    w.mask = "(xf_ == 0)"  # once per kernel: the first element of the first program
    if after:
        for s in k.after:
            w.emit_with_deps(s)


def render_check(name: str, c: IndexCheck, block: int, program: Program, faults: FaultTable) -> str:
    """A kernel checking every index of `c.buf` (in [0, rows), or [-rows, rows) where they wrap),
    recording the first offender's flat position."""
    slot = faults.add(FaultKind.INDEX, c.node, c.buf, c.rows, c.wrap)
    n = program.buffers[c.buf].type.numel
    lo = -c.rows if c.wrap else 0
    p = param(c.buf)
    return "\n".join(
        [
            f"def {name}({p}, faults):",
            "    pid_ = tl.program_id(0).to(tl.int64)",
            f"    xf_ = pid_ * {block} + tl.arange(0, {block})",
            f"    m_ = xf_ < {n}",
            f"    ix_ = tl.load({p} + xf_, mask=m_, other=0)",
            f"    _vf_first(faults + {slot}, m_ & ((ix_ < {lo}) | (ix_ >= {c.rows})), xf_)",
        ]
    )
