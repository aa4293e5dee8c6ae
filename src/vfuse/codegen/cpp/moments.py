"""Passes 0 and 1 of a row walk as one pass of per-lane moments (`Kernel.moments`, decided by
`schedule/moments.py`): each lane keeps the mean and the sum of squared deviations M2 of its
elements; a chunk of vectors is loaded once, its own mean and squared deviations computed from
registers, and merged into the lane's (Chan et al.: delta = the chunk's mean - the lane's,
M2 += M2_chunk + delta^2 * na * nb / (na + nb), mean += delta * nb / (na + nb)). At the row's end
pass 0's sum is n times the lane means' mean, and around pass 1's mean c (from that sum):
sum((x - c)^2) = sum(M2) + n / lanes * sum((lane mean - c)^2), sum(x - c) = n / lanes *
sum(lane mean - c). Over a constant row every mean is the value and every M2 0, exactly (a running
sum would not be), so the frontend's corrected mean is exact there as in the two passes."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir import DType
from vfuse.schedule.kernel import Compute, Load, Pass


def render_moments(w: KernelWriter, p0: Pass, p1: Pass, render_prefetch: Callable[[], None]) -> None:
    """Pass 0's row statements, the moments loop, pass 1's row statements (its prefetch share
    first, `render_prefetch()`), and both passes' sums."""
    assert w.k.moments is not None
    (lanes, chunk), (vec,) = w.k.moments, w.k.inner
    x, dev, sq = p0.body[0], p1.body[1], p1.body[2]
    assert isinstance(x, Load) and isinstance(dev, Compute)
    total, by_arg = p0.reduces[0].var, {r.arg: r.var for r in p1.reduces}
    for s in p0.before:
        w.stmt(s)
    v, n, step = w.names[vec.var], vec.size, chunk * lanes
    w.w(f"float {total}_mo, mo_lm[{lanes}], mo_lq[{lanes}];")  # the lanes' means and M2
    w.open("{")
    w.w(f"typedef float vm_t __attribute__((vector_size({4 * lanes})));")
    w.w(f"typedef float vm_u __attribute__((vector_size({4 * lanes}), aligned(4), may_alias));")
    w.w("vm_t mo_m, mo_q;")
    w.open("{")
    w.w(f"const int64_t {v} = 0;")
    _chunk(w, x, lanes, chunk)
    w.w("mo_m = mo_cm;")
    w.w("mo_q = mo_cq;")
    w.close()
    w.open(f"for (int64_t {v} = {step}; {v} < {n}; {v} += {step}) {{")
    _chunk(w, x, lanes, chunk)
    # na elements of a lane so far, nb = chunk in the chunk: exact in float below 2^24
    w.w(f"const float mo_na = (float)({v} / {lanes});")
    w.w(f"const float mo_wb = {float(chunk)!r}f / (mo_na + {float(chunk)!r}f);")
    w.w("const vm_t mo_dl = mo_cm - mo_m;")
    w.w("mo_q = mo_q + mo_cq + mo_dl * mo_dl * (mo_na * mo_wb);")
    w.w("mo_m = mo_m + mo_dl * mo_wb;")
    w.close()
    w.w("*(vm_u*)mo_lm = mo_m;")
    w.w("*(vm_u*)mo_lq = mo_q;")
    w.close()
    w.w(f"float mo_fold[{lanes}];")
    w.w(f"for (int mo_l = 0; mo_l < {lanes}; ++mo_l) mo_fold[mo_l] = mo_lm[mo_l];")
    w.w(f"for (int mo_h = {lanes // 2}; mo_h >= 1; mo_h /= 2)")
    w.w("  for (int mo_l = 0; mo_l < mo_h; ++mo_l) mo_fold[mo_l] += mo_fold[mo_l + mo_h];")
    w.w(f"{total}_mo = mo_fold[0] * {float(n) / lanes!r}f;")
    w.dtypes[total] = DType.F32
    w.w(f"const float {total} = {total}_mo;")
    render_prefetch()
    for s in p1.before:
        w.stmt(s)
    _around(w, dev.args[1], lanes, n // lanes, by_arg[sq.var], by_arg.get(dev.var))


def _around(w: KernelWriter, c: str, lanes: int, per_lane: int, squares: str, deviations: str | None) -> None:
    """Pass 1's sums around its mean `c`: of squared deviations, and of deviations if it takes them."""
    w.w("float mo_m2 = 0.0f, mo_s1 = 0.0f, mo_sp = 0.0f;")
    w.open(f"for (int mo_l = 0; mo_l < {lanes}; ++mo_l) {{")
    w.w(f"const float mo_e = mo_lm[mo_l] - {c};")
    w.w("mo_m2 += mo_lq[mo_l];")
    w.w("mo_s1 += mo_e;")
    w.w("mo_sp += mo_e * mo_e;")
    w.close()
    for var in (squares, deviations):
        if var is not None:
            w.dtypes[var] = DType.F32
    w.w(f"const float {squares} = mo_m2 + mo_sp * {float(per_lane)!r}f;")
    if deviations is not None:
        w.w(f"const float {deviations} = mo_s1 * {float(per_lane)!r}f;")


def _chunk(w: KernelWriter, x: Load, lanes: int, chunk: int) -> None:
    """The chunk at the SIMD loop variable: its lanes' means `mo_cm` and squared deviations `mo_cq`."""
    w.w(f"const float* mo_x = &{pointer(x.buf)}[{w.idx(x.index)}];")
    loads = [f"mo_v{c}" for c in range(chunk)]
    for c, name in enumerate(loads):
        w.w(f"const vm_t {name} = *(const vm_u*)(mo_x + {c * lanes});")
    w.w(f"const vm_t mo_cs = {_tree(loads)};")
    w.w(f"const vm_t mo_cm = mo_cs * {1.0 / chunk!r}f;")
    devs = [f"mo_d{c}" for c in range(chunk)]
    for name, load in zip(devs, loads, strict=True):
        w.w(f"const vm_t {name} = {load} - mo_cm;")
    w.w(f"const vm_t mo_cq = {_tree([f'{d} * {d}' for d in devs])};")


def _tree(terms: list[str]) -> str:
    """A pairwise sum of `terms`: (a + b) + (c + d)."""
    while len(terms) > 1:
        terms = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2], strict=True)]
    return terms[0]
