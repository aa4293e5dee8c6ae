"""The GEMM template (`Op.MATMUL`) and what the contraction templates share: operand tiles computed
by the group's prologue, and the pointwise epilogue applied to the fp32 accumulator tile.

One program computes a `block_m` x `block_n` tile of C (fp32 accumulator, `tl.dot` over
`block_k` steps of K), tiles in grouped order (`group_m` rows of tiles walked together so the
B panels they share stay in L2), the batch index first. Operands are read from their buffers in
their own dtype (fp16 / bf16 go to the tensor cores as they are), or computed per tile by the
group's prologue (`OperandPrologue`: casts, dequantize) and rounded to the dot's dtype. Every
access is masked: the interpreter has no bounds and a GPU would fault. The tiles and dtype come
from the schedule (`ContractionKernel.gpu`, `schedule/gpu.py`); nothing is decided here.

The interpreter computes bf16 dots wrongly (and its own float conversions truncate), so bf16
operands are widened with `_vf_bf2f` when `_VF_INTERPRETED` (set by the loader) is true; a GPU
compile sees the constant false and multiplies bf16 on the tensor cores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vfuse.codegen.triton.names import WIDEN_FP8, LoopGroup, literal, param
from vfuse.codegen.triton.writer import SEEDS, FaultTable, TritonWriter
from vfuse.ir import DType
from vfuse.schedule import expr
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.kernel import BufKind, ContractionKernel, Kernel, Loop, Pass, Program, Stmt, Store

INTERPRETED = "_VF_INTERPRETED"  # module constant: true when the loader wraps the module for the interpreter
TL_DOT = {"fp16": "tl.float16", "bf16": "tl.bfloat16", "fp32": "tl.float32"}  # "fp8": the buffers' own


class Section:
    """Statements of a template (prologue or epilogue) rendered by the pointwise writer over
    loop groups whose flat indices the template defines (`groups`: (flat name, its definition,
    the loops it walks))."""

    def __init__(self, k: ContractionKernel, program: Program, faults: FaultTable) -> None:
        self.k, self.program, self.faults = k, program, faults

    def render(
        self,
        stmts: Sequence[Stmt],
        groups: Sequence[tuple[str, str, Sequence[Loop]]],
        mask: str,
        depth: int,
        store: Store | None = None,
        full: bool = True,
    ) -> list[str]:
        """`full`: the store's index spans the tile (else its pointer is broadcast to the mask:
        Triton stores no value into a smaller pointer tensor)."""
        loops = tuple(lp for _, _, ls in groups for lp in ls)
        body: tuple[Stmt | Store, ...] = (*stmts, *([store] if store else []))
        kernel = Kernel(self.k.name, self.k.group, self.k.label, (), loops, (Pass((), body, ()),), (), ())
        lgroups = [LoopGroup(flat, ls) for flat, _, ls in groups]
        w = TritonWriter(kernel, self.program, self.faults, lgroups)
        w.depth, w.mask = depth, mask
        for s in stmts:
            w.emit(s)
        if store is not None:
            w.emit_deps(store)
            idx = w.index.render(store.index) + ("" if full else f" + 0 * {mask}.to(tl.int32)")
            value = {DType.F16: f"{store.arg}.to(tl.float16)", DType.BF16: f"_vf_f2bf({store.arg})"}
            w.w(f"tl.store({param(store.buf)} + {idx}, {value.get(store.dtype, store.arg)}, mask={mask})")
        pad = "    " * depth
        head = [f"{pad}{flat} = {d}" for flat, d, _ in groups]
        for g in lgroups:
            head += [pad + line for line in w.index.take(g)]
        return head + w.lines


def loops_of(shape: Sequence[int], first: int = 0) -> tuple[Loop, ...]:
    return tuple(Loop(first + d, n) for d, n in enumerate(shape))


def batch_offset(out_batch: Sequence[int], op_batch: Sequence[int], inner: int, flat: str = "bz_") -> str:
    """The element offset of operand batch `op_batch` (aligned right, size-1 dims broadcast) at the
    output's flat batch index `flat`, each batch a contiguous block of `inner` elements."""
    op = (1,) * (len(out_batch) - len(op_batch)) + tuple(op_batch)
    if tuple(op) == tuple(out_batch):
        return f"{flat} * {inner}" if math.prod(out_batch) > 1 else "0"
    terms, step, ostride = [], inner, 1
    for d in reversed(range(len(out_batch))):
        if op[d] != 1:
            terms.append(f"(({flat} // {ostride}) % {out_batch[d]}) * {step}")
        step *= op[d]
        ostride *= out_batch[d]
    return " + ".join(terms) or "0"


def batch_flat(out_batch: Sequence[int], op_batch: Sequence[int], flat: str = "bz_") -> str:
    """The operand's own flat batch index (row-major over `op_batch`) at the output's `flat`."""
    return batch_offset(out_batch, op_batch, 1, flat)


def signature_params(k: ContractionKernel, program: Program) -> tuple[list[str], list[str]]:
    """(parameter names, the values they are bound to) of a template: its buffers, then the seeds."""
    bufs = program.buffers
    values = [v for v in k.buffers if bufs[v].kind is not BufKind.SEED]
    seeds = any(bufs[v].kind is BufKind.SEED for v in k.buffers)
    names = [param(v) for v in values] + (["seeds"] if seeds else [])
    return names, values + ([SEEDS] if seeds else [])


def epilogue_groups(space: Sequence[int], rows: str, cols: str, ncols: int) -> list[tuple[str, str, Sequence[Loop]]]:
    """Loop groups of the epilogue's index space over a tile whose rows are the flat index `rows`
    ([BM, 1]) and columns `cols` ([1, BN]) of an output with `ncols` columns: rows and columns
    apart when `space` keeps the column dim, else one flat index."""
    loops = loops_of(space)
    if space and space[-1] == ncols:
        return [("er_", rows, loops[:-1]), ("ec_", cols, loops[-1:])]
    return [("ef_", f"{rows} * {ncols} + {cols}", loops)]


def epilogue(
    sec: Section, rows: str, cols: str, ncols: int, mask: str, depth: int = 1, groups: list | None = None
) -> list[str]:
    """The group's epilogue on the accumulator `v` and the store of its result into `k.out`."""
    k = sec.k
    coords = tuple(Lin() if n == 1 else Lin.var(Var(d)) for d, n in enumerate(k.space))
    dtype = sec.program.buffers[k.out].type.dtype
    store = Store(k.out, expr.row_major(coords, k.space), k.result, dtype)
    groups = groups or epilogue_groups(k.space, rows, cols, ncols)
    used = expr.var_ids(store.index)
    sides = {_SIDE[flat] for flat, _, loops in groups if any(lp.var in used for lp in loops)}
    full = "full" in sides or {"rows", "cols"} <= sides
    return sec.render(k.epilogue, groups, mask, depth, store, full)


# Which part of the [rows, cols] tile each epilogue group's flat index spans (names used here,
# in conv.py and attention.py).
_SIDE = {"er_": "rows", "en_": "rows", "ep_": "rows", "ec_": "cols", "eo_": "cols", "ef_": "full"}


def dot_lines(a: str, b: str, dot: str, depth: int, widen: tuple[str, str] = ("_vf_bf2f", "_vf_bf2f")) -> list[str]:
    """`acc_ += a @ b` at the schedule's dot dtype (fp32: exact, no TF32; bf16, fp8: widened in
    the interpreter by `widen`'s helpers, exactly)."""
    pad = "    " * depth
    wa, wb = widen
    if dot == "fp32":
        return [f'{pad}acc_ = tl.dot({a}, {b}, acc_, input_precision="ieee")']
    if dot == "fp16":
        return [f"{pad}acc_ = tl.dot({a}, {b}, acc_)"]
    return [
        f"{pad}if {INTERPRETED}:",
        f'{pad}    acc_ = tl.dot({wa}({a}), {wb}({b}), acc_, input_precision="ieee")',
        f"{pad}else:",
        f"{pad}    acc_ = tl.dot({a}, {b}, acc_)",
    ]


def to_dot(value: str, dot: str) -> str:
    """A prologue's fp32 result (already rounded to the contraction's dtype) as the dot's operand."""
    if dot == "bf16":
        return f"_vf_f2bf({value})"
    return f"{value}.to({TL_DOT[dot]})"


def tile_order(tiles_m: int, tiles_n: int, group_m: int) -> list[str]:
    """pid -> (bz_, tm_, tn_): the batch index, then tiles in groups of `group_m` rows."""
    per = tiles_m * tiles_n
    width = group_m * tiles_n
    return [
        f"bz_ = pid_ // {per}",
        f"t_ = pid_ % {per}",
        f"first_ = (t_ // {width}) * {group_m}",
        f"gm_ = tl.minimum({tiles_m} - first_, {group_m})",
        f"tm_ = first_ + (t_ % {width}) % gm_",
        f"tn_ = (t_ % {width}) // gm_",
    ]


def _operand_tile(sec: Section, i: int, depth: int) -> list[str]:
    """Lines leaving operand `i`'s tile in `a_` (i = 0: [BM, BK]) or `b_` ([BK, BN]) in the dot's dtype."""
    k = sec.k
    g = k.gpu
    assert g is not None
    _, _, n, kk = _dims(k)
    out_batch = k.out_shape[:-2]
    shape = k.shapes[i]
    name = "a_" if i == 0 else "b_"
    pad = "    " * depth
    mask = "mm_[:, None] & mk_[None, :]" if i == 0 else "mk_[:, None] & mn_[None, :]"
    pro = k.prologue(i)
    if pro is None:
        p = param(k.operands[i])
        off = batch_offset(out_batch, shape[:-2], shape[-1] * shape[-2])
        if i == 0:
            idx = f"rm_[:, None] * {kk} + rk_[None, :]"
        elif k.trans_b:
            idx = f"rn_[None, :] * {kk} + rk_[:, None]"
        else:
            idx = f"rk_[:, None] * {n} + rn_[None, :]"
        load = f"tl.load({p} + {off} + {idx}, mask={mask}, other=0.0)"
        return [f"{pad}{name} = {load}" if g.dot != "fp32" else f"{pad}{name} = {load}.to(tl.float32)"]
    loops = loops_of(shape)
    bflat = batch_flat(out_batch, shape[:-2])
    if i == 0:
        groups = [
            ("ab_", bflat, loops[:-2]),
            ("am_", "rm_[:, None]", loops[-2:-1]),
            ("ak_", "rk_[None, :]", loops[-1:]),
        ]
    else:
        groups = [
            ("bb_", bflat, loops[:-2]),
            ("bk_", "rk_[:, None]", loops[-2:-1]),
            ("bn_", "rn_[None, :]", loops[-1:]),
        ]
    lines = sec.render(pro.stmts, groups, f"({mask})", depth)
    return [*lines, f"{pad}{name} = tl.where({mask}, {to_dot(pro.result, g.dot)}, 0.0)"]


def _widen(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """The interpreter's exact widening of each operand tile (fp8 dots: by the buffer's format)."""
    if k.fp8 is None:
        return ("_vf_bf2f", "_vf_bf2f")
    a, b = (WIDEN_FP8[program.buffers[v].type.dtype] for v in k.operands[:2])
    return a, b


def _scales(k: ContractionKernel) -> str:
    """The fp8 dot's per-tensor scales, applied to the fp32 accumulator (`schedule/fp8dot.py`)."""
    if k.fp8 is None:
        return ""
    return "".join(f" * {tl_scale(s)}" for s in k.fp8.scales if s != 1.0)


def tl_scale(s: float | str) -> str:
    return literal(s, DType.F32) if isinstance(s, float) else f"tl.load({param(s)}).to(tl.float32)"


def _dims(k: ContractionKernel) -> tuple[int, int, int, int]:
    m, n = k.out_shape[-2:]
    return math.prod(k.out_shape[:-2]), m, n, k.shapes[0][-1]


def render_gemm(k: ContractionKernel, program: Program, faults: FaultTable) -> tuple[list[str], list[str], list[str]]:
    """(function lines, parameter names, values bound) of a MATMUL template."""
    g = k.gpu
    assert g is not None
    _, m, n, kk = _dims(k)
    tiles_m, tiles_n = -(-m // g.block_m), -(-n // g.block_n)
    sec = Section(k, program, faults)
    pid = "tl.program_id(0).to(tl.int64)" if g.wide else "tl.program_id(0)"
    body = [f"pid_ = {pid}", *tile_order(tiles_m, tiles_n, g.group_m)]
    body += [
        f"rm_ = tm_ * {g.block_m} + tl.arange(0, {g.block_m})",
        f"rn_ = tn_ * {g.block_n} + tl.arange(0, {g.block_n})",
        f"mm_ = rm_ < {m}",
        f"mn_ = rn_ < {n}",
        f"acc_ = tl.full([{g.block_m}, {g.block_n}], 0.0, tl.float32)",
        f"for k0_ in range({-(-kk // g.block_k)}):",
        f"    rk_ = k0_ * {g.block_k} + tl.arange(0, {g.block_k})",
        # K a multiple of the block: a constant mask the compiler folds away (no per-step compares)
        f"    mk_ = tl.full([{g.block_k}], 1, tl.int1)" if kk % g.block_k == 0 else f"    mk_ = rk_ < {kk}",
    ]
    lines = ["    " + ln for ln in body]
    lines += _operand_tile(sec, 0, 2) + _operand_tile(sec, 1, 2) + dot_lines("a_", "b_", g.dot, 2, _widen(k, program))
    lines += [f"    v = acc_{_scales(k)}", "    om_ = mm_[:, None] & mn_[None, :]"]
    lines += epilogue(sec, f"(bz_ * {m} + rm_)[:, None]", "rn_[None, :]", n, "om_")
    names, values = signature_params(k, program)
    return lines, names, values
