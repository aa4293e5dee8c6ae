"""Passes 0 and 1 of a row walk as one pass of per-lane moments (`Kernel.moments`, decided by
`schedule/moments.py`): each lane keeps the sum and the sum of squared deviations of its elements;
a chunk of vectors is loaded once, its own mean and squared deviations computed from
registers, and merged into the lane's (Chan et al.: M2 += M2_chunk + delta^2 * na * nb / (na + nb),
delta = the chunk's mean - the lane's, the lane's mean taken from its running sum); at the row's end
M2 = the lanes' M2 + n / lanes * sum of (lane mean - row mean)^2. Pass 0's sum is the lanes' sums
folded in halves, so pass 1's mean (sum / n) is the one the squared deviations are taken around."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir import DType
from vfuse.schedule.kernel import Load, Pass


def render_moments(w: KernelWriter, p0: Pass, p1: Pass, render_prefetch: Callable[[], None]) -> None:
    """Pass 0's row statements, the moments loop, pass 1's row statements (its prefetch share
    first, `render_prefetch()`), and both passes' sums."""
    assert w.k.moments is not None
    (lanes, chunk), (vec,) = w.k.moments, w.k.inner
    x = p0.body[0]
    assert isinstance(x, Load)
    total, squares = p0.reduces[0].var, p1.reduces[0].var
    for s in p0.before:
        w.stmt(s)
    v, n, step = w.names[vec.var], vec.size, chunk * lanes
    w.w(f"float {total}_mo, {squares}_mo;")
    w.open("{")
    w.w(f"typedef float vm_t __attribute__((vector_size({4 * lanes})));")
    w.w(f"typedef float vm_u __attribute__((vector_size({4 * lanes}), aligned(4), may_alias));")
    w.w("vm_t mo_s, mo_q;")  # each lane's sum and sum of squared deviations
    w.open("{")
    w.w(f"const int64_t {v} = 0;")
    _chunk(w, x, lanes, chunk)
    w.w("mo_s = mo_cs;")
    w.w("mo_q = mo_cq;")
    w.close()
    w.open(f"for (int64_t {v} = {step}; {v} < {n}; {v} += {step}) {{")
    _chunk(w, x, lanes, chunk)
    # Chan et al.'s merge with the lane's mean taken from its sum (as accurate as the sum);
    # na elements of a lane so far, nb = chunk in the chunk: exact in float below 2^24.
    w.w(f"const float mo_na = (float)({v} / {lanes});")
    w.w(f"const vm_t mo_dl = mo_cs * {1.0 / chunk!r}f - mo_s * (1.0f / mo_na);")
    w.w(f"mo_q = mo_q + mo_cq + mo_dl * mo_dl * (mo_na * {float(chunk)!r}f / (mo_na + {float(chunk)!r}f));")
    w.w("mo_s = mo_s + mo_cs;")
    w.close()
    _lanes(w, lanes, n)
    w.w(f"{total}_mo = mo_t;")
    w.w(f"{squares}_mo = mo_m2;")
    w.close()
    w.dtypes[total] = w.dtypes[squares] = DType.F32
    w.w(f"const float {total} = {total}_mo;")
    render_prefetch()
    for s in p1.before:
        w.stmt(s)
    w.w(f"const float {squares} = {squares}_mo;")


def _chunk(w: KernelWriter, x: Load, lanes: int, chunk: int) -> None:
    """The chunk at the SIMD loop variable: its lanes' sums `mo_cs` and squared deviations `mo_cq`."""
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


def _lanes(w: KernelWriter, lanes: int, n: int) -> None:
    """The row's sum `mo_t` (lane sums folded in halves) and sum of squared deviations `mo_m2`:
    the lanes' own plus n / lanes times each lane mean's squared distance from the row's."""
    w.w(f"float mo_sv[{lanes}], mo_qv[{lanes}], mo_fold[{lanes}];")
    w.w("*(vm_u*)mo_sv = mo_s;")
    w.w("*(vm_u*)mo_qv = mo_q;")
    w.w("*(vm_u*)mo_fold = mo_s;")
    w.w(f"for (int mo_h = {lanes // 2}; mo_h >= 1; mo_h /= 2)")
    w.w("  for (int mo_l = 0; mo_l < mo_h; ++mo_l) mo_fold[mo_l] += mo_fold[mo_l + mo_h];")
    w.w("const float mo_t = mo_fold[0];")
    w.w(f"const float mo_mean = mo_t / {float(n)!r}f;")
    w.w("float mo_m2 = 0.0f, mo_spread = 0.0f;")
    w.open(f"for (int mo_l = 0; mo_l < {lanes}; ++mo_l) {{")
    w.w(f"const float mo_e = mo_sv[mo_l] * {lanes / n!r}f - mo_mean;")
    w.w("mo_m2 += mo_qv[mo_l];")
    w.w("mo_spread += mo_e * mo_e;")
    w.close()
    w.w(f"mo_m2 += mo_spread * {float(n // lanes)!r}f;")


def _tree(terms: list[str]) -> str:
    """A pairwise sum of `terms`: (a + b) + (c + d)."""
    while len(terms) > 1:
        terms = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2], strict=True)]
    return terms[0]
