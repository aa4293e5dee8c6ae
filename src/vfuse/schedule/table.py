"""Lookup-table kernels: a pointwise kernel whose only tensor input is one byte wide.

A pointwise function of one byte has 256 possible results. When a kernel's stores depend on
exactly one load of an int8 / uint8 / bool buffer, and everything else it computes comes from
constants, the C++ backend evaluates the kernel's own scalar statements once for each of the
256 byte values into a table and the loop becomes `out[i] = table[(uint8_t)in[i]]`
(codegen/cpp/table.py). The table is filled by the same statements the plain loop would run,
so results are bit-identical; a long chain (dequantize -> GELU -> requantize: ~40 flops of
erf per element) becomes one byte shuffle per element.

Scalars read at run time (a scale or zero point that is a graph input: an unfrozen module,
torch.compile(dynamic=True) lifting Python floats) may enter the table too: the kernel then
fills it on a call whose scalars differ from the last fill's (256 evaluations), so only
kernels of many elements take it (`MIN_REFILL_ELEMENTS`).
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.ir import DType
from vfuse.ir.defs.pointwise import INT_DIVISION
from vfuse.ir.sym import hint
from vfuse.schedule import expr
from vfuse.schedule.kernel import Compute, Const, Kernel, Load, Store, stmt_index

# Input dtypes with at most 256 distinct values.
TABLE_DTYPES = (DType.I8, DType.U8, DType.BOOL)
# A chain this short (a cast, one add) is already as cheap as the lookup.
MIN_OPS = 3
# A table refilled per call (run-time scalars in it) pays for 256 evaluations: 16x that many elements.
MIN_REFILL_ELEMENTS = 16 * 256


def with_table(k: Kernel) -> Kernel:
    """`k` marked to run as a lookup table (`Kernel.table`: the var of its one byte load),
    or `k` itself when it has other inputs (tensors, RAND, IOTA, CAT), reductions or few ops.
    Loads of one element (scalars) may come with the byte load."""
    if k.outer or k.after or len(k.passes) != 1:
        return k
    (p,) = k.passes
    if p.reduces or p.buffered or p.reloaded:
        return k
    stmts = (*p.before, *p.body)
    if any(not isinstance(s, Load | Const | Compute | Store) for s in stmts):
        return k
    loads = [s for s in stmts if isinstance(s, Load)]
    byte = [s for s in loads if not invariant(s)]
    if len(byte) != 1 or byte[0].dtype not in TABLE_DTYPES:
        return k
    if len(loads) > 1 and hint(math.prod(lp.size for lp in k.inner)) < MIN_REFILL_ELEMENTS:
        return k
    # A data-dependent index (a gather) reads at positions the table cannot know.
    if any(expr.dyn_names(e) for s in stmts for e in stmt_index(s)):
        return k
    if sum(isinstance(s, Compute) for s in stmts) < MIN_OPS or _may_divide_by_zero(stmts):
        return k
    return dataclasses.replace(k, table=byte[0].var)


def invariant(s: Load) -> bool:
    """A load of one element for the whole kernel (a 0-d input): a scalar the table is filled with."""
    return not s.index.terms


def _may_divide_by_zero(stmts: tuple) -> bool:
    """An integer division whose divisor is not a nonzero constant: the table is filled for all
    256 byte values, also those the input never holds, so it could divide by zero where the
    plain loop does not (and the fill has no fault record)."""
    consts = {s.var: s.value for s in stmts if isinstance(s, Const)}
    return any(
        isinstance(s, Compute) and s.op in INT_DIVISION and not s.dtype.is_float and not consts.get(s.args[1], 0)
        for s in stmts
    )
