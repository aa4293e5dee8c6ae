"""What a row kernel's pass knows about its values beyond their dtype (`Pass.recips`, `Pass.nonpos`).

Two facts, both found from the pass's statements and the kernel's reductions:
- divisors that are the same for the whole pass (a row's sum, as in softmax), so each element
  costs a multiply by a reciprocal computed once per row instead of a division;
- values of the form x - amax(x) over the row (softmax, log-softmax), which are <= 0 or NaN,
  so their exp needs neither an overflow check nor the two-step scaling of a general exp.
"""

from __future__ import annotations

from vfuse.ir import DType, Op
from vfuse.schedule.kernel import Compute, Const, Kernel, Pass, Store

RECIP_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})  # computed in float


def pass_invariant_divisors(k: Kernel, i: int) -> frozenset[str]:
    """Float divisors in pass `i`'s body defined before its loop: its own `before` values and
    the reductions and `before` values of earlier passes. ATen's softmax multiplies by 1/sum
    too; the quotient moves by at most an ulp. A constant divisor (x / 0.3) keeps eager's exact
    division: an fp16/bf16 result would show that ulp after rounding."""
    if k.table:  # a table kernel defines its scalars inside the table's builder
        return frozenset()
    p = k.passes[i]
    row_scalars = {s.var for s in p.before if not isinstance(s, Store | Const)}
    for q in k.passes[:i]:
        row_scalars |= {r.var for r in q.reduces} | {s.var for s in q.before if not isinstance(s, Store | Const)}
    return frozenset(
        s.args[1]
        for s in p.body
        if isinstance(s, Compute) and s.op is Op.DIV and s.dtype in RECIP_DTYPES and s.args[1] in row_scalars
    )


def below_row_max(k: Kernel, p: Pass) -> frozenset[str]:
    """Float values x - m of `p`'s body where m is the row's amax of that same x (variables
    are single-assignment, so equal names are equal values): <= 0, or NaN when the row holds
    a NaN (m is then NaN) or x = m = +inf."""
    row_max = {r.var: r.arg for q in k.passes for r in q.reduces if r.op is Op.AMAX}
    return frozenset(
        s.var
        for s in p.body
        if isinstance(s, Compute) and s.op is Op.SUB and s.dtype is DType.F32 and row_max.get(s.args[1]) == s.args[0]
    )
