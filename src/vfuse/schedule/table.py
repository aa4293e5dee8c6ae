"""Lookup-table kernels: a pointwise kernel whose only tensor input is one byte wide.

A pointwise function of one byte has 256 possible results. When a kernel's stores depend on
exactly one load of an int8 / uint8 / bool buffer, and everything else it computes comes from
constants, the C++ backend evaluates the kernel's own scalar statements once for each of the
256 byte values into a table and the loop becomes `out[i] = table[(uint8_t)in[i]]`
(codegen/cpp/table.py). The table is filled by the same statements the plain loop would run,
so results are bit-identical; a long chain (dequantize -> GELU -> requantize: ~40 flops of
erf per element) becomes one byte shuffle per element.
"""

from __future__ import annotations

import dataclasses

from vfuse.ir import DType
from vfuse.ir.defs.pointwise import INT_DIVISION
from vfuse.schedule import expr
from vfuse.schedule.kernel import Compute, Const, Kernel, Load, Store, stmt_index

# Input dtypes with at most 256 distinct values.
TABLE_DTYPES = (DType.I8, DType.U8, DType.BOOL)
# A chain this short (a cast, one add) is already as cheap as the lookup.
MIN_OPS = 3


def with_table(k: Kernel) -> Kernel:
    """`k` marked to run as a lookup table (`Kernel.table`: the var of its one byte load),
    or `k` itself when it has other inputs (tensors, RAND, IOTA, CAT), reductions or few ops."""
    if k.outer or k.after or len(k.passes) != 1:
        return k
    (p,) = k.passes
    if p.reduces or p.buffered or p.reloaded:
        return k
    stmts = (*p.before, *p.body)
    if any(not isinstance(s, Load | Const | Compute | Store) for s in stmts):
        return k
    loads = [s for s in stmts if isinstance(s, Load)]
    if len(loads) != 1 or loads[0].dtype not in TABLE_DTYPES:
        return k
    # A data-dependent index (a gather) reads at positions the table cannot know.
    if any(expr.dyn_names(e) for s in stmts for e in stmt_index(s)):
        return k
    if sum(isinstance(s, Compute) for s in stmts) < MIN_OPS or _may_divide_by_zero(stmts):
        return k
    return dataclasses.replace(k, table=loads[0].var)


def _may_divide_by_zero(stmts: tuple) -> bool:
    """An integer division whose divisor is not a nonzero constant: the table is filled for all
    256 byte values, also those the input never holds, so it could divide by zero where the
    plain loop does not (and the fill has no fault record)."""
    consts = {s.var: s.value for s in stmts if isinstance(s, Const)}
    return any(
        isinstance(s, Compute) and s.op in INT_DIVISION and not s.dtype.is_float and not consts.get(s.args[1], 0)
        for s in stmts
    )
