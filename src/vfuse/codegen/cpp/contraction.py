"""Render a `ContractionKernel`: the GEMM / conv / flash-attention template with the group's
epilogue, plus a `static void kN(bufs, arena, seeds, nt)` wrapper that finds the buffers and
calls it, so a segment entry calls it like any other kernel (threads follow `nt`).

The epilogue statements are the schedule's ordinary statements, rendered with the same rules
as every pointwise kernel; only the names of the output coordinates differ per template:
GEMM (b = flat batch, i, j), conv (n, c, p = oh * OW + ow), attention (b, h, i, c). A GEMM
epilogue ending in a cast stores that value (int8, bf16, ...) into C. GEMM operand prologues
are rendered the same way into the packers, over the operand's coordinates (b, r, c).
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.codegen.cpp.attention import AttentionSpec, MaskKind
from vfuse.codegen.cpp.attention.render import shared_instance
from vfuse.codegen.cpp.gemm import (
    ConvSpec,
    Epilogue,
    EpilogueArg,
    GemmSpec,
    render_conv2d,
    render_gemm,
)
from vfuse.codegen.cpp.gemm.conv_wgrad import render_conv2d_folded
from vfuse.codegen.cpp.gemm.int8 import Int8Spec, render_int8_gemm
from vfuse.codegen.cpp.gemm.prepack import prepack_layout
from vfuse.codegen.cpp.gemm.prologue import Prologue, fits_int32
from vfuse.codegen.cpp.rules import STORAGE_TYPE, STORE_CONVERT
from vfuse.codegen.cpp.scatter import render_scatter
from vfuse.codegen.cpp.writer import StatementWriter, pointer, pointer_line
from vfuse.ir import DType, Op
from vfuse.ir.defs.attention_grad import grad_row_strides
from vfuse.ir.defs.contraction import sdpa_dropout
from vfuse.ir.sym import same
from vfuse.schedule import expr
from vfuse.schedule.kernel import ContractionKernel, Load, Program

Names = dict[int, str]  # loop variable id -> C++ expression


def _batch_names(batch: tuple[int, ...], rank: int) -> list[str]:
    """C++ indices of the last `rank` dims of `batch` out of the flat batch index `b` (an
    operand's batch dims align with the output's from the right, as in broadcasting)."""
    names = [f"((b / {math.prod(batch[d + 1 :])}) % {size})" for d, size in enumerate(batch)]
    return names[len(batch) - rank :]


def _gemm_names(k: ContractionKernel) -> list[str]:
    """Per output dim, its C++ index: batch dims come out of the flat batch index `b`."""
    return [*_batch_names(k.out_shape[:-2], len(k.out_shape) - 2), "i", "j"]


def _prologue(k: ContractionKernel, i: int) -> Prologue | None:
    """Operand `i`'s prologue over its own coordinates: batch dims from `b`, then r, c."""
    pro = k.prologue(i)
    if pro is None:
        return None
    rank = len(k.shapes[i])
    names = [*_batch_names(k.out_shape[:-2], rank - 2), "r", "c"]
    w = StatementWriter(dict(enumerate(names)))
    for s in pro.stmts:
        w.stmt(s)
    lines = tuple(line.strip() for line in w.lines)
    inner = expr.Var(rank + pro.inner)
    # The loads one packer step reads as a contiguous run: their addresses, for the packer's prefetch.
    runs = tuple(
        dict.fromkeys(f"&{pointer(s.buf)}[{w.idx(s.index)}]" for s in pro.stmts
                      if isinstance(s, Load) and s.index.coef(inner) == 1)
    )  # fmt: skip
    return Prologue(
        lines, pro.result, "r" if pro.inner == -2 else "c", fits_int32(pro.stmts, k.shapes[i]), prefetch=runs
    )


def _conv_names(k: ContractionKernel) -> list[str]:
    ow = k.out_shape[3]
    return ["n", "c", f"(p / {ow})", f"(p % {ow})"]


def _attention_names(k: ContractionKernel) -> list[str]:
    return ["b", "h", "i", "c"][4 - len(k.out_shape) :]


def _groups(shape: tuple, space: tuple) -> list[tuple[range, range]]:
    """Dims of the contraction's output `shape` and of the epilogue's `space` in aligned groups,
    from the right, each pair spanning as many elements (a view's split or merge of dims): equal
    trailing dims pair one to one; the rest split where the sizes are known, else one group."""
    common = 0
    while common < min(len(shape), len(space)) and shape[-1 - common] == space[-1 - common]:
        common += 1
    lead, out_lead = len(shape) - common, len(space) - common
    tail = [(range(lead + d, lead + d + 1), range(out_lead + d, out_lead + d + 1)) for d in range(common)]
    return [*_split(shape[:lead], space[:out_lead]), *tail]


def _split(shape: tuple, space: tuple) -> list[tuple[range, range]]:
    whole = [(range(len(shape)), range(len(space)))] if space else []
    if not all(isinstance(n, int) and n > 0 for n in (*shape, *space)):
        return whole
    groups, a, b, ea, eb, pa, pb = [], len(shape), len(space), len(shape), len(space), 1, 1
    while a > 0 or b > 0:
        if b == 0 or (a > 0 and pa <= pb):
            a, pa = a - 1, pa * shape[a - 1]
        else:
            b, pb = b - 1, pb * space[b - 1]
        # Close a group where both sides span as many elements; size-1 dims left over on one
        # side join the leftmost group.
        if pa == pb and a < ea and b < eb and (a > 0 or b == 0) and (b > 0 or a == 0):
            groups.append((range(a, ea), range(b, eb)))
            ea, eb, pa, pb = a, b, 1, 1
    return groups[::-1] if a == ea and b == eb else whole


class _EpilogueWriter(StatementWriter):
    """Epilogue statements over `space` whose index terms over a group of space dims that come
    from one flat output index collapse back to it: a bias read through `view(b, t, 3, h, d)`
    of a Linear's output is `j`, one contiguous vector load, not div/mod per lane (a gather)."""

    def __init__(self, names: Names, collapse: list[tuple[tuple[int, ...], tuple[int, ...], int]]) -> None:
        super().__init__(names)
        self.collapse = collapse  # (space dims, their row-major strides in the group, flat's id)

    def idx(self, e: expr.Lin) -> str:
        for dims, strides, flat in self.collapse:
            coefs = [e.coef(expr.Var(d)) for d in dims]
            c = coefs[-1] if coefs else 0
            if isinstance(c, int) and c != 0 and all(k == c * st for k, st in zip(coefs, strides, strict=True)):
                e = e - expr.Lin(0, tuple((expr.Var(d), k) for d, k in zip(dims, coefs, strict=True)))
                e = e + expr.Lin.var(expr.Var(flat)) * c
        return super().idx(e)


_FLAT = 1 << 20  # ids of the flat output indices (the space's own dims are 0..rank-1)


def _epilogue_writer(k: ContractionKernel, names: list[str]) -> StatementWriter:
    """A writer naming the epilogue's loop space (`k.space`) from the template's per-dim names of
    the contraction's output: an output dim of equal size keeps its name; the space dims of a
    group are div/mod of the group's flat output index (hoisted out of the SIMD column loop)."""
    shape, space = k.out_shape, k.space
    if same(shape, space):
        return StatementWriter(dict(enumerate(names)))
    out: Names = {}
    collapse = []
    for ra, rb in _groups(shape, space):
        flat = " + ".join(f"{names[d]} * {math.prod(shape[d + 1 : ra.stop])}" for d in ra) or "0"
        if len(ra) == 1 and len(rb) == 1:
            out[rb.start] = names[ra.start]
            continue
        for d in rb:
            out[d] = f"((({flat}) / {math.prod(space[d + 1 : rb.stop])}) % {space[d]})"
        if len(rb) > 1 and all(isinstance(n, int) for n in space[rb.start : rb.stop]):
            out[_FLAT + rb.start] = f"({flat})"
            dims = tuple(d for d in rb if space[d] != 1)  # a size-1 dim's index is 0 at any coefficient
            collapse.append((dims, tuple(math.prod(space[d + 1 : rb.stop]) for d in dims), _FLAT + rb.start))
    return _EpilogueWriter(out, collapse)


def _statements(k: ContractionKernel, names: list[str], out: DType = DType.F32) -> list[str]:
    """The epilogue as C++ statements on `float v` (the rules' rendering, one line each); with
    another output dtype the result is not assigned back to `v` (see `_store`)."""
    w = _epilogue_writer(k, names)
    w.dtypes["v"] = DType.F32
    for s in (*k.epilogue, *k.stores):
        w.stmt(s)
    lines = [line.strip() for line in w.lines]
    if k.result != "v" and out is DType.F32:
        lines.append(f"v = {k.result};")
    return lines


def _store(k: ContractionKernel, out: DType) -> str:
    """The value written to C: `v` for fp32, else the epilogue's result in C's storage type."""
    return "v" if out is DType.F32 else STORE_CONVERT.get(out, "{0}").format(k.result)


def _extras(k: ContractionKernel, program: Program) -> tuple[EpilogueArg, ...]:
    args = tuple(EpilogueArg(pointer(v), f"const {STORAGE_TYPE[program.buffers[v].type.dtype]}*") for v in k.extras)
    args += tuple(EpilogueArg(pointer(s.buf), f"{STORAGE_TYPE[program.buffers[s.buf].type.dtype]}*") for s in k.stores)
    # Symbolic sizes (`vf_s0`, ir/sym.py) read the seeds array: it goes wherever the epilogue's args go.
    return (*args, EpilogueArg("seeds", "const int64_t*")) if program.symbols else args


def _gemm(k: ContractionKernel, program: Program) -> tuple[str, str]:
    if k.int8 is not None:
        return _int8_gemm(k, program)
    a, b = k.shapes
    pa, pb = _prologue(k, 0), _prologue(k, 1)
    # The schedule's blocks (per call over a symbolic M: `schedule/blocks.py`); the first piece
    # names the register tile.
    blocks = k.gemm_blocks
    assert blocks is not None, f"{k.name}: a CPU GEMM without the schedule's cache blocks"
    spec = GemmSpec.from_shapes(
        f"{k.name}_mm", a, b, k.trans_b, linkage="static", blocking=blocks.blocks[0], a_prologue=pa,
        b_prologue=pb, prepack=k.prepacked_b, call=blocks, shared_a=k.shared_a,
    )  # fmt: skip
    out = program.buffers[k.out].type.dtype
    stmts = tuple(_statements(k, _gemm_names(k), out))
    epi = Epilogue(k.op.value, _extras(k, program), stmts, _store(k, out), STORAGE_TYPE[out])
    if k.colsum is not None:  # a bias gradient: column sums of an epilogue value (gemm/driver.py)
        sums = pointer(k.colsum.buf)
        args = (*epi.args, EpilogueArg(sums, "float*"))
        epi = dataclasses.replace(epi, args=args, colsum=k.colsum.arg, colsum_out=sums)
    if k.prepacked_b and spec.tiles().nr != k.nr:  # prepack_bytes sized the region for k.nr
        raise ValueError(f"{k.name}: blocking nr {spec.tiles().nr} is not the kernel's {k.nr}")
    return render_gemm(spec, epi), f"{spec.name}({_args(k)}, {_out(k)}{epi.names()}{_pre(k, program)}, nt);"


def _pre(k: ContractionKernel, program: Program) -> str:
    """The prepacked B's slot of the arena's persistent region, as the template's last argument."""
    return f", arena + {prepack_layout(program)[0][k.name]}" if k.prepacked_b else ""


def _int8_gemm(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """The schedule's int8 dot product (`ContractionKernel.int8`): operands read from the int8
    buffers among the extras, the dequantization folded into the int32 result's scale."""
    q = k.int8
    assert q is not None
    (m, kk), n = k.shapes[0], k.out_shape[-1]
    spec = Int8Spec(
        f"{k.name}_i8", m, n, kk, pointer(q.x), pointer(q.w), q.x_zero, q.x_scale, q.w_zero, q.w_scale,
        pointer(q.w_scales) if q.w_scales else "", q.kind, q.mr, q.nr, q.mcb, k.prepacked_b,
    )  # fmt: skip
    out = program.buffers[k.out].type.dtype
    epi = Epilogue(k.op.value, _extras(k, program), tuple(_statements(k, _gemm_names(k), out)), _store(k, out),
                   STORAGE_TYPE[out])  # fmt: skip
    return render_int8_gemm(spec, epi), f"{spec.name}({_out(k)}{epi.names()}{_pre(k, program)}, nt);"


def _conv(k: ContractionKernel, program: Program) -> tuple[str, str]:
    (n, c, h, w), (o, _, kh, kw) = k.shapes
    a = k.attrs
    spec = ConvSpec(
        f"{k.name}_conv", n, c, h, w, o, kh, kw, tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]),
        a["groups"], linkage="static", caches=k.caches, prepack=k.prepacked_b, compact=bool(a.get("compact")),
        blocking=k.gemm_blocks.blocks[0] if k.gemm_blocks else None, blocks=k.conv_blocks, call=k.gemm_blocks,
    )  # fmt: skip
    epi = Epilogue(k.op.value, _extras(k, program), tuple(_statements(k, _conv_names(k))))
    call = f"{spec.name}({_args(k)}, {_out(k)}{epi.names()}{_pre(k, program)}, nt);"
    if a.get("folded"):  # a weight gradient: one GEMM over all images (decided in schedule/contraction.py)
        return render_conv2d_folded(spec, epi, swapped=bool(a.get("swapped"))), call
    if k.prepacked_b and spec.tiles().mr != k.mr:  # prepack_bytes sized the weight's slot for k.mr
        raise ValueError(f"{k.name}: blocking mr {spec.tiles().mr} is not the kernel's {k.mr}")
    return render_conv2d(spec, epi), call


def _mask_strides(mask: tuple[int, ...]) -> list[int]:
    """Element strides of a contiguous mask broadcast over [B, H, LQ, LK] (0: broadcast dim)."""
    full = (1,) * (4 - len(mask)) + mask
    strides, step = [], 1
    for size in reversed(full):
        strides.append(step if size != 1 else 0)
        step *= size
    return list(reversed(strides))


def _mask(k: ContractionKernel, program: Program, at: int) -> tuple[MaskKind, str, list[int]]:
    """(kind, pointer, element strides over [B, H, LQ, LK]) of the attention mask, operand `at` if any."""
    if len(k.operands) - (1 if sdpa_dropout(k.attrs) else 0) <= at:  # the seed is last
        return MaskKind.NONE, "nullptr", [0, 0, 0, 0]
    kind = MaskKind.BOOL if program.buffers[k.operands[at]].type.dtype is DType.BOOL else MaskKind.ADDITIVE
    return kind, pointer(k.operands[at]), _mask_strides(k.shapes[at])


def _attention_spec(k: ContractionKernel, q: tuple[int, ...], v: tuple[int, ...], mask: MaskKind,
                    epilogue: str = "") -> AttentionSpec:  # fmt: skip
    # Head sizes: constants of the template, specialized by the schedule (_sdpa_operands).
    return AttentionSpec(
        f"{k.name}_attn", int(q[-1]), int(v[-1]), bool(k.attrs["causal"]), mask, *k.blocks, epilogue=epilogue,
        lanes=k.vector, tile=k.nr, lse=k.op is Op.SDPA_LSE, dropout=sdpa_dropout(k.attrs),
    )  # fmt: skip


def _seed_args(k: ContractionKernel) -> str:
    """Dropout's trailing kernel arguments: the seed's value (the last operand) and the stream."""
    if not sdpa_dropout(k.attrs):
        return ""
    return f", {pointer(k.operands[-1])}[0], {int(k.attrs['stream'])}"


def _sizes(k: ContractionKernel, q: tuple[int, ...], kk: tuple[int, ...]) -> str:
    """B, H, HKV, LQ, LK and the scale, as the templates take them."""
    batch = q[0] if len(q) == 4 else 1
    scale = k.attrs["scale"] if k.attrs["scale"] is not None else 1.0 / math.sqrt(int(q[-1]))
    return f"{', '.join(map(str, [batch, q[-3], kk[-3], q[-2], kk[-2]]))}, {float(scale)!r}f"


def _attention(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """SDPA, or SDPA_LSE (no epilogue; the logsumexp follows the output in its buffer)."""
    q, kk, v = k.shapes[:3]
    mask, mptr, strides = _mask(k, program, 3)
    body = " ".join(["float v = o;", *_statements(k, _attention_names(k)), "o = v;"])
    spec = _attention_spec(k, q, v, mask, body if k.op is Op.SDPA else "")
    ptrs = [pointer(x) for x in k.operands[:3]]
    source, fn = shared_instance(spec)  # every layer's alike attention: one instance (attention/render.py)
    call = f"{fn}({', '.join(ptrs)}, {mptr}, {_out(k)}, {_sizes(k, q, kk)}, {', '.join(map(str, strides))}, nt"
    call += f"{_seed_args(k)});"
    return source, call


def _attention_backward(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """SDPA_BACKWARD: dq, dk, dv written at their offsets in the one flat output (attr perm: their
    rows at the permuted stack's strides, ir/defs/attention_grad.grad_row_strides)."""
    _, q, kk, v = k.shapes[:4]
    mask, mptr, strides = _mask(k, program, 6)
    spec = _attention_spec(k, q, v, mask)
    ins = ", ".join(pointer(x) for x in k.operands[:6])
    out, nq, nk = _out(k), math.prod(q), math.prod(kk)
    rows = [0, 0, 0]  # each gradient contiguous
    if k.attrs.get("perm") is not None:
        nq, *rows = grad_row_strides(tuple(int(x) for x in q), tuple(k.attrs["perm"]))
        nk = nq
    grads = f"{out}, {out} + {nq}, {out} + {nq + nk}"
    sizes = ", ".join(map(str, [*strides, *rows]))
    source, fn = shared_instance(spec, backward=True)
    call = f"{fn}({ins}, {mptr}, {grads}, {_sizes(k, q, kk)}, {sizes}, nt{_seed_args(k)});"
    return source, call


def _args(k: ContractionKernel) -> str:
    """Operand pointers; an operand its packer computes has none."""
    return ", ".join("nullptr" if k.prologue(i) else pointer(v) for i, v in enumerate(k.operands))


def _out(k: ContractionKernel) -> str:
    return pointer(k.out)


_TEMPLATES = {
    Op.MATMUL: _gemm,
    Op.CONV2D: _conv,
    Op.SDPA: _attention,
    Op.SDPA_LSE: _attention,
    Op.SDPA_BACKWARD: _attention_backward,
    Op.SCATTER_ADD: render_scatter,
}


def render_contraction(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """(the template instance, placed before the kernels; the wrapper function)."""
    source, call = _TEMPLATES[k.op](k, program)
    lines = [pointer_line(v, program.buffers[v], v in k.written) for v in k.buffers]
    desc = ", ".join(f"%{v}{list(s)}" for v, s in zip(k.operands, k.shapes, strict=True))
    head = f"static void {k.name}(void* const* bufs, char* arena, const int64_t* seeds, int nt) {{"
    outs = ", ".join(f"%{v}" for v in k.written)
    doc = f"// group {k.group} ({k.label}): {k.op.value}({desc}) -> {outs}, {len(k.epilogue)} epilogue stmt(s)"
    body = "\n".join(f"  {line}" for line in (*lines, "(void)arena; (void)seeds;", call))
    return source, "\n".join([doc, head, body, "}"])
