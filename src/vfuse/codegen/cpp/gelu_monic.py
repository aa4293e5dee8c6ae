"""The erf-form GELU's rational in w = a^2 with P monic (P and Q over P's leading coefficient), one
table for both preludes: the row kernels' `vf_gelu_none` (prelude.py) and the GEMM epilogues'
`vg_gelu_erf` (gemm/prelude.py). Same constants, same evaluation order, so both round alike; the
derivation and error figures are in docs/perf-log.md (sessions 17-18)."""

from __future__ import annotations

# (coefficient of w, constant) of P's and Q's Estrin pairs; P's w^6 coefficient is 1 (an add).
_P = (("346816768.0f", "3778768640.0f"), ("1670494.375f", "43137332.0f"), ("-203.26756286621094f", "30827.796875f"))
_Q = (("2447992576.0f", "9471968256.0f"), ("17710390.0f", "279354656.0f"))
_Q_TOP = "604503.625f"  # Q's w^4 coefficient


def monic_pq(fmaf: str, indent: str = "  ") -> str:
    """C++ lines defining floats `p` and `q` from `w` and `w2 = w * w`, with `fmaf` the prelude's fma."""
    lines = [f"const float p{2 * i} = {fmaf}({a}, w, {b});" for i, (a, b) in enumerate(_P)]
    lines.append(f"const float p = {fmaf}(w2, {fmaf}(w2, w2 + p4, p2), p0);")
    lines += [f"const float q{2 * i} = {fmaf}({a}, w, {b});" for i, (a, b) in enumerate(_Q)]
    lines.append(f"const float q = {fmaf}(w2, {fmaf}(w2, {_Q_TOP}, q2), q0);")
    return "".join(f"{indent}{line}\n" for line in lines)
