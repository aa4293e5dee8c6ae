"""Single-pass row moments (`Kernel.moments`): a row walk whose first pass sums a row `x` and whose
second sums `(x - sum / n)^2` and maybe `x - sum / n` (LayerNorm's mean and variance, as the
frontend decomposes them: the corrected two-pass algorithm of frontend/lower_reduce.py) takes both
in one pass over the row: each lane keeps the mean and the sum of squared deviations of its
elements, chunk by chunk (a chunk's own two-pass moments merged into the lane's by Chan et al.'s
update), and the lanes are merged the same way at the row's end (codegen/cpp/moments.py).

Why: over rows that do not fit the last-level cache each pass over a row is a dependent chain the
next row's loads wait behind, and the second pass is one more of them. LayerNorm 8192 x 768
(AVX-512, 2 threads, kernels alone): 0.75-0.80x of the three-pass kernel's time; a copy is 0.65x.
Not in cache: 512 x 768 1.02-1.03x, 64 x 768 1.11-1.13x slower (the chunk merges are a serial
chain that the three passes' independent lane chains are not), hence the gate on the bytes moved.
Its rounding differs from the two-pass sums (both are stable: Chan's merge of exact chunk moments).
"""

from __future__ import annotations

import math

from vfuse.ir import DType, Op
from vfuse.ir.sym import is_sym
from vfuse.schedule.kernel import Compute, Const, Kernel, Load, Pass, Walk

CHUNK = 4  # vectors per chunk: its mean and squared deviations computed from registers
MIN_CHUNKS = 2  # a row of one chunk is the three-pass kernel's work already


def plan_moments(k: Kernel, vector: int, llc: int) -> tuple[int, int] | None:
    """(fp32 lanes, vectors a chunk) of the single-pass moments for `k` (module docstring), None
    where not taken: a
    `Walk.ROWS` kernel over one static row of whole chunks, passes 0 and 1 as LayerNorm's, moving
    more bytes than the last-level cache holds (`llc`; 0: unknown, not taken)."""
    if k.walk is not Walk.ROWS or len(k.inner) != 1 or len(k.passes) < 3 or vector < 4 or not llc:
        return None
    n = k.inner[0].size
    if is_sym(n) or n % (CHUNK * vector) or n // (CHUNK * vector) < MIN_CHUNKS:
        return None
    rows = math.prod(lp.size for lp in k.outer)
    if is_sym(rows) or not _moments_passes(k.passes[0], k.passes[1], n):
        return None
    # The row read and the output written: 8 bytes an element.
    return (vector, CHUNK) if rows * n * 8 > llc else None


def _moments_passes(p0: Pass, p1: Pass, n: int) -> bool:
    """p0 = sum(x), p1 = sum((x - total / n)^2) and maybe sum(x - total / n) of one fp32 load x,
    nothing else in either loop."""
    if any(p.buffered or p.reloaded or p.streamed or p.residue or p.ranges for p in (p0, p1)):
        return False
    if len(p0.body) != 1 or len(p0.reduces) != 1 or len(p1.body) != 3 or len(p1.reduces) not in (1, 2):
        return False
    x, total = p0.body[0], p0.reduces[0]
    if not isinstance(x, Load) or x.dtype is not DType.F32 or p1.body[0] != x:
        return False
    if total.op is not Op.SUM or total.arg != x.var or total.dtype is not DType.F32:
        return False
    dev, sq = p1.body[1], p1.body[2]
    if not (isinstance(dev, Compute) and dev.op is Op.SUB and dev.args[0] == x.var):
        return False
    if not (isinstance(sq, Compute) and sq.op is Op.MUL and sq.args == (dev.var, dev.var)):
        return False
    if sorted(r.arg for r in p1.reduces) != sorted((sq.var, dev.var)[: len(p1.reduces)]):
        return False
    if any(r.op is not Op.SUM or r.dtype is not DType.F32 for r in p1.reduces):
        return False
    return _is_mean(dev.args[1], total.var, n, (*p0.before, *p1.before))


def _is_mean(var: str, total: str, n: int, stmts: tuple) -> bool:
    """`var` = total / n or total * (1 / n), n the row length, a constant of the kernel."""
    by_var = {s.var: s for s in stmts if isinstance(s, Compute | Const)}
    mean = by_var.get(var)
    if not isinstance(mean, Compute) or total not in mean.args or len(mean.args) != 2:
        return False
    other = by_var.get(mean.args[1] if mean.args[0] == total else mean.args[0])
    if not isinstance(other, Const) or not isinstance(other.value, int | float):
        return False
    if mean.op is Op.DIV:
        return mean.args[0] == total and other.value == n
    return mean.op is Op.MUL and abs(other.value * n - 1) < 1e-6
