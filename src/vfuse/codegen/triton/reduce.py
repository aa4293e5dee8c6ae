"""Row reductions in a tile: per-lane accumulators over the row's chunks, folded once per row.

Each lane of the [rows, block] tile (or [block, columns] for column reductions) accumulates the
elements it sees, chunk after chunk; the lanes are folded along the reduced axis at the end of
the pass. Floats accumulate in fp32 (fp16/bf16 too: eager's low-precision sums are less exact,
and the interpreter's bf16 sums are wrong: triton #11604); max/min propagate NaN like torch;
argmax/argmin keep each lane's first winner and take the smallest index among the lanes that
hold the row's winner (NaN wins, as in torch).
"""

from __future__ import annotations

from vfuse.codegen.triton.names import COMPUTE, HIGHEST, LOWEST
from vfuse.codegen.triton.writer import TritonWriter
from vfuse.ir import DType, Op, opdef
from vfuse.schedule.kernel import Reduce

BIG = "9223372036854775807"
# (combine function for tl.reduce, the same fold written inline for the lanes of a looped pass)
FOLD: dict[Op, tuple[str, str]] = {
    Op.SUM: ("_vf_add", "{a} + {b}"),
    Op.PROD: ("_vf_mul", "{a} * {b}"),
    Op.AMAX: ("_vf_max", "tl.maximum({a}, {b})"),
    Op.AMIN: ("_vf_min", "tl.minimum({a}, {b})"),
    Op.ANY: ("_vf_max", "tl.maximum({a}, {b})"),
    Op.ALL: ("_vf_min", "tl.minimum({a}, {b})"),
    Op.ARGMAX: ("_vf_max", ""),
    Op.ARGMIN: ("_vf_min", ""),
}


def acc_type(r: Reduce) -> str:
    if r.op in (Op.ANY, Op.ALL):
        return "tl.int8"
    return COMPUTE[r.arg_dtype if opdef(r.op).returns_index else r.dtype]


def tracks_nan(r: Reduce) -> bool:
    """Float max/min (and arg max/min): NaN wins, counted in a flag beside the max / min."""
    return r.op in (Op.AMAX, Op.AMIN, Op.ARGMAX, Op.ARGMIN) and r.arg_dtype.is_float


def identity(r: Reduce) -> str:
    """The value a masked lane contributes."""
    dtype = r.arg_dtype if opdef(r.op).returns_index else r.dtype
    op = {Op.ARGMAX: Op.AMAX, Op.ARGMIN: Op.AMIN}.get(r.op, r.op)
    if op in (Op.SUM, Op.ANY):
        return "0"
    if op in (Op.PROD, Op.ALL):
        return "1"
    if dtype.is_float:
        return 'float("-inf")' if op is Op.AMAX else 'float("inf")'
    if dtype is DType.BOOL:
        return "0" if op is Op.AMAX else "1"
    return str(LOWEST[dtype] if op is Op.AMAX else HIGHEST[dtype])


def _contribution(w: TritonWriter, r: Reduce) -> str:
    """This chunk's value of `r.arg` in every lane, the identity where masked (NaN too, for max
    and min: their flag counts it)."""
    x = r.arg
    if r.op in (Op.ANY, Op.ALL):
        x = f"({x} != 0).to(tl.int8)"
    elif not opdef(r.op).returns_index and COMPUTE[r.arg_dtype] != acc_type(r):
        x = f"{x}.to({acc_type(r)})"
    ident = f"tl.full([], {identity(r)}, {acc_type(r)})"
    keep = f"{w.mask} & ({x} == {x})" if tracks_nan(r) else w.mask
    return f"tl.where({keep}, {x}, {ident})"


def init(w: TritonWriter, r: Reduce, shape: str) -> None:
    """The accumulators of a looped pass, one per lane of the tile `shape`."""
    w.w(f"{r.var}_acc = tl.full({shape}, {identity(r)}, {acc_type(r)})")
    if tracks_nan(r):
        w.w(f"{r.var}_nan = tl.full({shape}, 0, tl.int8)")
    if opdef(r.op).returns_index:
        w.w(f"{r.var}_idx = tl.full({shape}, {BIG}, tl.int64)")


def update(w: TritonWriter, r: Reduce, first: bool) -> None:
    """Fold this chunk into the lanes (`first`: the only chunk, the lanes are just the chunk)."""
    c = _contribution(w, r)
    nan = f"({w.mask} & ({r.arg} != {r.arg})).to(tl.int8)"
    if opdef(r.op).returns_index:
        _update_index(w, r, c, nan, first)
        return
    if first:
        w.w(f"{r.var}_acc = {c}")
        if tracks_nan(r):
            w.w(f"{r.var}_nan = {nan}")
        return
    w.w(f"{r.var}_acc = {FOLD[r.op][1].format(a=f'{r.var}_acc', b=c)}")
    if tracks_nan(r):
        w.w(f"{r.var}_nan = tl.maximum({r.var}_nan, {nan})")


def _update_index(w: TritonWriter, r: Reduce, c: str, nan: str, first: bool) -> None:
    """Each lane keeps its first winner: a NaN (the first one) beats any number."""
    acc, idx, flag = f"{r.var}_acc", f"{r.var}_idx", f"{r.var}_nan"
    pos = f"({w.index.render(r.rindex)} + tl.full([], 0, tl.int64))"
    is_nan = nan if tracks_nan(r) else "tl.full([], 0, tl.int8)"
    if first:
        w.w(f"{acc} = {c}")
        w.w(f"{flag} = {is_nan}")
        w.w(f"{idx} = tl.where({w.mask}, {pos}, {BIG})")
        return
    w.w(f"{r.var}_x = {c}")
    w.w(f"{r.var}_n = {is_nan}")
    x, n = f"{r.var}_x", f"{r.var}_n"
    wins = f"({x} > {acc})" if r.op is Op.ARGMAX else f"({x} < {acc})"
    better = f"({w.mask} & ({flag} == 0) & (({n} != 0) | {wins} | ({idx} == {BIG})))"
    w.w(f"{r.var}_b = {better}")
    w.w(f"{acc} = tl.where({r.var}_b, {x}, {acc})")
    w.w(f"{flag} = tl.where({r.var}_b, {n}, {flag})")
    w.w(f"{idx} = tl.where({r.var}_b, {pos}, {idx})")


def finish(w: TritonWriter, r: Reduce, axis: int) -> None:
    """The row's result from its lanes: `r.var`, one value per row (kept as a size-1 axis)."""
    acc, comb = f"{r.var}_acc", FOLD[r.op][0]
    red = f"tl.reduce({{}}, {axis}, {{}}, keep_dims=True)"
    if tracks_nan(r):
        w.w(f"{r.var}_hn = {red.format(f'{r.var}_nan', '_vf_max')} != 0")
    if opdef(r.op).returns_index:
        w.w(f"{r.var}_t = {red.format(acc, comb)}")
        hit = f"({acc} == {r.var}_t)"
        if tracks_nan(r):
            hit = f"tl.where({r.var}_hn, {r.var}_nan != 0, {hit})"
        w.w(f"{r.var} = {red.format(f'tl.where({hit}, {r.var}_idx, {BIG})', '_vf_min')}")
    elif r.op in (Op.ANY, Op.ALL):
        w.w(f"{r.var} = {red.format(acc, comb)} != 0")
    elif tracks_nan(r):
        w.w(f'{r.var} = tl.where({r.var}_hn, float("nan"), {red.format(acc, comb)})')
    else:
        w.w(f"{r.var} = {red.format(acc, comb)}")
    w.defined.add(r.var)
