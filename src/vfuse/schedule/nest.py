"""Turn a lowered statement list into a Kernel: passes over the row, placement, merged loops.

Every kernel is a nest of `outer` loops (rows) around `inner` loops (the row). A pointwise
kernel has no outer loops: its inner loops are the whole domain, parallel on the outside and
SIMD inside. A row kernel runs its outer loops in parallel and walks the row once per pass:
a reduction result is usable one pass after the pass that accumulates it (LayerNorm: mean in
pass 0, variance in pass 1, normalized stores in pass 2). An inner value several passes need is
recomputed (cheap ops: the row is in L1/L2 anyway) or, when it is expensive, kept in a row
buffer by the first pass and reloaded by the later ones (softmax's exp).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vfuse.ir import DType, TensorType, opdef
from vfuse.ir.sym import SymSize, hint
from vfuse.schedule import expr
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.gates import SizeGate, size_choice
from vfuse.schedule.kernel import Compute, Kernel, Load, Loop, Pass, Place, Reduce, Stmt, Store, stmt_args, stmt_index

# A row buffer must stay cache-resident to pay off (per thread, fp32 elements).
ROW_BUFFER_MAX = 64 * 1024
# Values costing at least this much to recompute (flops, loads) get a row buffer instead.
EXPENSIVE_FLOPS = 8
# A kernel streams its stores past the caches when they add up to this many LLCs. Outputs near
# the LLC's size partly stay cached for the next reader (or the next call): streamed, softmax
# 8192x1024 (32 MiB out, 32 MiB LLC) got 10-30% slower; gelu_residual (128 MiB) 13% faster.
STREAM_MIN_LLCS = 2


def _flops(s: Stmt) -> int:
    """Rough per-element cost: the op's flop weight, 1 per load (2 with an fp16/bf16 conversion)."""
    if isinstance(s, Load):
        return 2 if s.dtype in (DType.F16, DType.BF16) else 1
    if not isinstance(s, Compute):
        return 0
    one = TensorType((1,), DType.F32)
    return opdef(s.op).flops((one,) * len(s.args), one, s.attrs)


def _recompute_cost(stmts: list[Stmt], inner: dict[str, bool]) -> dict[str, int]:
    """What recomputing each inner value costs per element (shared producers counted per use)."""
    cost: dict[str, int] = {}
    for s in stmts:
        cost[s.var] = _flops(s) + sum(cost.get(d, 0) for d in _deps(s) if inner.get(d))
    return cost


def _deps(s: Stmt | Store) -> set[str]:
    out = set(stmt_args(s)) if not isinstance(s, Store) else {s.arg}
    for e in stmt_index(s):
        out |= expr.dyn_names(e)
    return out


@dataclasses.dataclass
class _Analysis:
    inner: dict[str, bool]
    level: dict[str, int]
    passes: int


def _analyze(stmts: list[Stmt], stores: list[Store], inner_vars: set[int]) -> _Analysis:
    inner: dict[str, bool] = {}
    level: dict[str, int] = {}
    for s in stmts:
        deps = _deps(s)
        if isinstance(s, Reduce):
            inner[s.var], level[s.var] = False, level[s.arg] + 1
            continue
        uses_var = any(expr.var_ids(e) & inner_vars for e in stmt_index(s))
        inner[s.var] = uses_var or any(inner[d] for d in deps)
        level[s.var] = max((level[d] for d in deps), default=0)
    last = [level[s.arg] for s in stores if _store_inner(s, inner, inner_vars)]
    last += [level[s.var] - 1 for s in stmts if isinstance(s, Reduce)]
    return _Analysis(inner, level, max(last, default=0) + 1)


def _store_inner(s: Store, inner: dict[str, bool], inner_vars: set[int]) -> bool:
    return inner[s.arg] or bool(expr.var_ids(s.index) & inner_vars)


def _needs(stmts: list[Stmt], stores: list[Store], an: _Analysis, buffer_ok: bool) -> tuple[dict, set[str]]:
    """Passes each inner statement is needed in, and which statements get a row buffer."""
    need: dict[str, set[int]] = {s.var: set() for s in stmts}
    for st in stores:
        if an.inner.get(st.arg):
            need[st.arg].add(an.level[st.arg])
    buffered: set[str] = set()
    cost = _recompute_cost(stmts, an.inner)
    for s in reversed(stmts):
        if isinstance(s, Reduce):
            if an.inner[s.arg]:
                need[s.arg].add(an.level[s.var] - 1)
            continue
        if not an.inner[s.var] or not need[s.var]:
            continue
        if len(need[s.var]) > 1 and buffer_ok and cost[s.var] >= EXPENSIVE_FLOPS:
            buffered.add(s.var)
        used = {min(need[s.var])} if s.var in buffered else need[s.var]
        for d in _deps(s):
            if an.inner.get(d):
                need[d] |= used
    return need, buffered


def _build_passes(
    stmts: list[Stmt], stores: list[Store], an: _Analysis, need: dict, buffered: set[str], inner_vars: set[int]
) -> tuple[list[Pass], list]:
    passes: list[Pass] = []
    for p in range(an.passes):
        before = tuple(s for s in stmts if not an.inner[s.var] and not isinstance(s, Reduce) and an.level[s.var] == p)
        reload = tuple(v for v in need if v in buffered and p in need[v] and p != min(need[v]))
        body: list[Stmt | Store] = [s for s in stmts if an.inner[s.var] and p in need[s.var] and s.var not in reload]
        body += [st for st in stores if _store_inner(st, an.inner, inner_vars) and an.level[st.arg] == p]
        reduces = tuple(s for s in stmts if isinstance(s, Reduce) and an.level[s.var] - 1 == p)
        write = tuple(v for v in buffered if min(need[v]) == p)
        passes.append(Pass(before, tuple(body), reduces, write, reload))
    after: list = [
        s for s in stmts if not an.inner[s.var] and not isinstance(s, Reduce) and an.level[s.var] >= an.passes
    ]
    after += [st for st in stores if not _store_inner(st, an.inner, inner_vars)]
    return passes, after


def _map_index(s: Stmt | Store, f: Callable[[Lin], Lin]) -> Stmt | Store:
    for fld in ("index", "coord", "rindex"):
        if hasattr(s, fld):
            return dataclasses.replace(s, **{fld: f(getattr(s, fld))})  # type: ignore[misc]
    return s


def _all_lins(k: Kernel) -> list[Lin]:
    out = [k.row_index]
    for p in k.passes:
        for s in (*p.before, *p.body, *p.reduces):
            out += stmt_index(s)
    for s in k.after:
        out += stmt_index(s)
    return out


def _rewrite(k: Kernel, f: Callable[[Lin], Lin]) -> Kernel:
    passes = tuple(
        dataclasses.replace(
            p,
            before=tuple(_map_index(s, f) for s in p.before),
            body=tuple(_map_index(s, f) for s in p.body),
            reduces=tuple(_map_index(s, f) for s in p.reduces),
        )
        for p in k.passes
    )
    after = tuple(_map_index(s, f) for s in k.after)
    return dataclasses.replace(k, passes=passes, after=after, row_index=f(k.row_index))  # type: ignore[arg-type]


def _merge_group(k: Kernel, loops: list[Loop]) -> tuple[Kernel, list[Loop]]:
    """Drop size-1 loops, then fuse adjacent loops that every index sees as one contiguous index."""
    kept: list[Loop] = []
    for lp in loops:
        if lp.size == 1:
            k = _rewrite(k, lambda e, v=Var(lp.var): expr.merge(e, v, v))
        else:
            kept.append(lp)
    out: list[Loop] = []
    for lp in kept:
        if out and expr.can_merge(Var(out[-1].var), Var(lp.var), lp.size, _all_lins(k)):
            outer = out.pop()
            k = _rewrite(k, lambda e, o=Var(outer.var), i=Var(lp.var): expr.merge(e, o, i))
            lp = dataclasses.replace(lp, size=outer.size * lp.size)
        out.append(lp)
    return k, out


def make_kernel(
    name: str,
    group: int,
    label: str,
    stmts: list[Stmt],
    stores: list[Store],
    outer: list[Loop],
    inner: list[Loop],
    buffers: tuple[str, ...],
) -> Kernel:
    """Schedule lowered statements into passes, place intermediates, merge and mark loops."""
    inner_vars = {lp.var for lp in inner}
    an = _analyze(stmts, stores, inner_vars)
    row_len = 1
    for lp in inner:
        row_len *= lp.size
    # Row buffers are heap-allocated per thread at the row's length: any size works, so the
    # choice is taken at the hint of a symbolic length.
    need, buffered = _needs(stmts, stores, an, hint(row_len) <= ROW_BUFFER_MAX)
    passes, after = _build_passes(stmts, stores, an, need, buffered, inner_vars)
    placement = {s.var: Place.ROW_BUFFER if s.var in buffered else Place.REGISTER for s in stmts}
    placement.update({st.buf: Place.MEMORY for st in stores})
    row_index = expr.row_major(tuple(Lin.var(Var(lp.var)) for lp in inner), tuple(lp.size for lp in inner))
    k = Kernel(name, group, label, (), (), tuple(passes), tuple(after), buffers, placement, row_index)
    k, outer = _merge_group(k, outer)
    k, inner = _merge_group(k, inner)
    return dataclasses.replace(k, outer=tuple(_mark(outer, inner, True)), inner=tuple(_mark(inner, outer, False)))


def _mark(loops: list[Loop], other: list[Loop], is_outer: bool) -> list[Loop]:
    """Rows run in parallel; a pointwise nest (no outer loops) is parallel outside, SIMD inside."""
    if is_outer:
        return [dataclasses.replace(lp, parallel=True) for lp in loops]
    marked = [dataclasses.replace(lp, vector=i == len(loops) - 1) for i, lp in enumerate(loops)]
    if not other and marked:
        # A single loop is split across threads and vectorized (`parallel for simd`).
        last = dataclasses.replace(marked[-1], parallel=len(marked) == 1)
        marked = [dataclasses.replace(lp, parallel=True) for lp in marked[:-1]] + [last]
    return marked


def with_streaming(k: Kernel, llc_bytes: int) -> Kernel:
    """Mark a kernel whose per-element stores add up to STREAM_MIN_LLCS last-level caches as
    streaming: its output lines would be evicted before anyone reads them, so writing them
    around the cache (non-temporal stores) saves the read-for-ownership of every line (a third
    of the traffic of `out = a + b`). Only where every such store is contiguous along the SIMD
    loop and made in a pass without reductions or row-buffer writes, which
    codegen/cpp/streaming.py writes through an L1 chunk buffer. Symbolic sizes that may end on
    either side of the limit stream per call (`StreamGate`)."""
    stores = streamable_stores(k)
    if not llc_bytes or not stores:
        return k
    total = 1
    for lp in (*k.outer, *k.inner):
        total *= lp.size
    return with_stream_choice(k, stream_choice(total * sum(s.dtype.itemsize for s in stores), llc_bytes))


# The gate of a per-call stream choice: the bytes as a size expression, and STREAM_MIN_LLCS
# last-level caches as the limit. Taken at the hint instead, a first call of 6145 rows left
# softmax 8192x1024 unstreamed and 1.31x slower than its static build.
StreamGate = SizeGate


def stream_choice(moved: SymSize | int, llc_bytes: int) -> bool | SizeGate:
    """Whether `moved` bytes (an int or a symbolic size) are STREAM_MIN_LLCS x `llc_bytes` or
    more: a bool where that holds or fails at every size, else the gate that decides per call."""
    return bool(llc_bytes) and size_choice(moved, STREAM_MIN_LLCS * llc_bytes)


def with_stream_choice(k: Kernel, choice: bool | SizeGate) -> Kernel:
    """`k` streaming always (True), never (False: `k` unchanged) or per call (a StreamGate)."""
    if choice is False:
        return k
    return dataclasses.replace(k, stream=True, stream_gate=choice if isinstance(choice, StreamGate) else None)


def streams_at_hint(k: Kernel) -> bool:
    """Whether `k` streams at the hints of its sizes (always, when it streams at a fixed size)."""
    return k.stream and (k.stream_gate is None or k.stream_gate.at_hint())


def stream_fixed(k: Kernel) -> Kernel:
    """`k` with a per-call stream choice taken at the hint: for walks whose renderers stream
    always or never (row groups, lookup tables)."""
    return dataclasses.replace(k, stream=streams_at_hint(k), stream_gate=None) if k.stream_gate else k


def streamable_stores(k: Kernel) -> list[Store]:
    """The per-element stores of `k` if codegen/cpp/streaming.py can stream them (each contiguous
    along the SIMD loop, made in passes without reductions or row-buffer writes), else []."""
    if not k.inner or (not k.outer and k.after):
        return []
    store_passes = [p for p in k.passes if any(isinstance(s, Store) for s in p.body)]
    if not store_passes or any(p.reduces or p.buffered for p in store_passes):
        return []
    stores = [s for p in store_passes for s in p.body if isinstance(s, Store)]
    vec = Var(k.inner[-1].var)
    return stores if all(_contiguous_along(s.index, vec) for s in stores) else []


def _contiguous_along(e: Lin, v: Var) -> bool:
    """Whether `e` steps by exactly 1 with `v` and `v` appears nowhere else in it."""
    return e.coef(v) == 1 and v.id not in expr.var_ids(e - Lin.var(v))
