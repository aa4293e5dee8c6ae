"""What a row kernel's pass knows about its values beyond their dtype (`Pass.recips`, `Pass.nonpos`,
`Pass.muladds`).

Three facts, all found from the pass's statements and the kernel's reductions:
- divisors that are the same for the whole pass (a row's sum, as in softmax), so each element
  costs a multiply by a reciprocal computed once per row instead of a division;
- values of the form x - amax(x) over the row (softmax, log-softmax), which are <= 0 or NaN,
  so their exp needs neither an overflow check nor the two-step scaling of a general exp;
- a normalization's affine step ((x - m) * s) * w + b, m and s row scalars: its * w + b as one
  fma (`affine_fmas`).
"""

from __future__ import annotations

from collections import Counter

from vfuse.ir import DType, Op
from vfuse.schedule.kernel import Compute, Const, Kernel, Pass, Select, Store

RECIP_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})  # computed in float


def pass_invariant_divisors(k: Kernel, i: int) -> frozenset[str]:
    """Float divisors in pass `i`'s body defined before its loop: its own `before` values and
    the reductions and `before` values of earlier passes. ATen's softmax multiplies by 1/sum
    too; the quotient moves by at most an ulp. A constant divisor (x / 0.3) keeps eager's exact
    division: an fp16/bf16 result would show that ulp after rounding."""
    if k.table:  # a table kernel defines its scalars inside the table's builder
        return frozenset()
    p = k.passes[i]
    row_scalars = _row_scalars(k, i)
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


def _row_scalars(k: Kernel, i: int) -> set[str]:
    """Values fixed for the whole of pass `i`: its own `before` values, and the reductions and
    `before` values of earlier passes."""
    p = k.passes[i]
    row_scalars = {s.var for s in p.before if not isinstance(s, Store | Const)}
    for q in k.passes[:i]:
        row_scalars |= {r.var for r in q.reduces} | {s.var for s in q.before if not isinstance(s, Store | Const)}
    return row_scalars


def affine_fmas(k: Kernel, i: int) -> tuple[tuple[str, str, str, str], ...]:
    """`Pass.muladds` of pass `i`: a normalized value n = (x - m) * s (m, s row scalars: LayerNorm's
    (x - mean) * rstd), times w, whose only use is an add (the affine step's + b), as one fma: three
    operations per element instead of four (ln_gelu's output loop is bound by its operations).
    a * b + c rounds once instead of twice. (x - m) * s itself keeps eager's form: as
    fma(x, s, -(m * s)) it would carry m * s's rounding, large where |m| is many times the
    row's deviation (a row of 2 at mean 10 was 5e-5 off eager)."""
    if k.table:  # a table kernel defines its scalars inside the table's builder
        return ()
    p = k.passes[i]
    row = _row_scalars(k, i)
    uses = Counter(a for s in p.body if isinstance(s, Compute | Select) for a in s.args)
    uses.update([s.arg for s in p.body if isinstance(s, Store)] + [r.arg for r in p.reduces] + list(p.buffered))
    f32 = {s.var: s for s in p.body if isinstance(s, Compute) and s.dtype is DType.F32}

    def centered(v: str) -> bool:
        sub = f32.get(v)
        return sub is not None and sub.op is Op.SUB and sub.args[1] in row and sub.args[0] not in row

    normalized = {
        s.var
        for s in f32.values()
        if s.op is Op.MUL and any(centered(c) and scale in row for c, scale in (s.args, s.args[::-1]))
    }
    muladds = []
    for s in f32.values():
        if s.op is not Op.ADD:
            continue
        for m, c in (s.args, s.args[::-1]):
            mul = f32.get(m)
            if mul is not None and uses[m] == 1 and mul.op is Op.MUL and any(a in normalized for a in mul.args):
                muladds.append((s.var, *mul.args, c))
                break
    return tuple(muladds)
