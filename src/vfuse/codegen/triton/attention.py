"""The attention template (`Op.SDPA`): FlashAttention-2's forward, the group's epilogue on O.

One program takes `block_m` query rows of one (batch, head); K and V are walked in blocks of
`block_n` keys with the online softmax (running max and sum in fp32, the O accumulator rescaled
when the max grows), and O is divided by the sum once at the end. Causal attention (torch's
top-left alignment: key j is seen by query i when j <= i) stops at the block holding the
diagonal, so the blocks above it are never read. With GQA the query head h reads key / value
head h // (H / Hkv). A boolean mask keeps keys, a float mask is added to the scaled scores; the
mask is read with its own broadcast strides. Dropout on P draws vfuse's counter-based mask at
the scores' flat index (the bits of the decomposed dropout, so the same as the C++ path's) after
the row sum, and scales O by 1 / (1 - p). A row whose every key is masked has a sum of 0:
its output is 0, as eager's. Head dims are padded to a power of two (masked).
"""

from __future__ import annotations

import math

from vfuse.codegen.triton.gemm import INTERPRETED, Section, epilogue, signature_params
from vfuse.codegen.triton.names import param
from vfuse.codegen.triton.writer import FaultTable
from vfuse.ir import DType
from vfuse.ir.defs.contraction import sdpa_dropout, sdpa_has_mask
from vfuse.ir.defs.rng import GOLDEN, MASK32
from vfuse.schedule.kernel import ContractionKernel, Program


def _pow2(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


def _mask_offset(shape: tuple[int, ...], scores: tuple[int, ...]) -> tuple[str, str, str]:
    """(per-program offset, row stride, column stride) of a mask of `shape` broadcast to `scores`
    ([*batch, H, Lq, Lk]), the program's batch and head in `b_`, `h_`."""
    full = (1,) * (len(scores) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for n in reversed(full):
        strides.append(0 if n == 1 else step)
        step *= n
    strides.reverse()
    batch = scores[:-3]
    terms, inner = [], 1
    for d in reversed(range(len(batch))):
        if strides[d]:
            terms.append(f"((b_ // {inner}) % {batch[d]}) * {strides[d]}")
        inner *= batch[d]
    if strides[-3]:
        terms.append(f"h_ * {strides[-3]}")
    return " + ".join(terms) or "0", str(strides[-2]), str(strides[-1])


def _scores(k: ContractionKernel, program: Program, causal: bool) -> list[str]:
    """Lines of one key block: `s_` the scaled scores of the block, masked keys at -inf."""
    q = k.shapes[0]
    lq, lk = q[-2], k.shapes[1][-2]
    lines = ['qk_ = tl.dot(q_, kt_, input_precision="ieee")' if k.gpu and k.gpu.dot == "fp32" else ""]
    if k.gpu and k.gpu.dot == "bf16":
        lines = [
            f"if {INTERPRETED}:",
            '    qk_ = tl.dot(_vf_bf2f(q_), _vf_bf2f(kt_), input_precision="ieee")',
            "else:",
            "    qk_ = tl.dot(q_, kt_)",
        ]
    elif k.gpu and k.gpu.dot == "fp16":
        lines = ["qk_ = tl.dot(q_, kt_)"]
    lines += ["s_ = qk_ * scale_", f"keep_ = mm_[:, None] & (rn_ < {lk})[None, :]"]
    if causal:
        lines.append("keep_ = keep_ & (rn_[None, :] <= rm_[:, None])")
    if sdpa_has_mask(len(k.operands), k.attrs):
        off, rs, cs = _mask_offset(k.shapes[3], (*q[:-1], lk))
        load = f"tl.load({param(k.operands[3])} + {off} + rm_[:, None] * {rs} + rn_[None, :] * {cs}, mask=keep_"
        if program.buffers[k.operands[3]].type.dtype is DType.BOOL:
            lines.append(f"keep_ = keep_ & ({load}, other=0) != 0)")
        else:
            lines.append(f"s_ = s_ + {_widen(load + ', other=0.0)', program.buffers[k.operands[3]].type.dtype)}")
    lines.append('s_ = tl.where(keep_, s_, float("-inf"))')
    del lq
    return lines


def _dropout(k: ContractionKernel) -> list[str]:
    """Dropout on P after the row sum (the softmax normalizes over every key): the counter is the
    scores' flat index, as the decomposed RAND over [*batch, H, Lq, Lk] draws it."""
    rate = sdpa_dropout(k.attrs)
    if not rate:
        return []
    lq, lk = k.shapes[0][-2], k.shapes[1][-2]
    idx = f"(bh_ * {lq} + rm_).to(tl.int64)[:, None] * {lk} + rn_[None, :]"
    return [f"p_ = tl.where(_vf_rand(dk_lo, dk_hi, {idx}) >= {rate!r}, p_, 0.0)"]


def _dropout_setup(k: ContractionKernel, program: Program) -> list[str]:
    """The dropout's key words, from the seed (the SDPA's last operand) and the stream."""
    rate = sdpa_dropout(k.attrs)
    if not rate:
        return []
    stream = int(k.attrs["stream"])
    slot = program.buffers[k.operands[-1]].slot
    return [
        f"seed_ = tl.load(seeds + {slot})",
        f"dk_lo = _vf_key_lo(seed_, {(stream * GOLDEN) & MASK32})",
        f"dk_hi = _vf_key_hi(seed_, {stream})",
    ]


def _widen(load: str, dtype: DType) -> str:
    return f"_vf_bf2f({load})" if dtype is DType.BF16 else f"{load}.to(tl.float32)"


def _pv(dot: str) -> list[str]:
    if dot == "fp32":
        return ['acc_ = tl.dot(p_, v_, acc_, input_precision="ieee")']
    if dot == "fp16":
        return ["acc_ = tl.dot(p_.to(tl.float16), v_, acc_)"]
    return [
        f"if {INTERPRETED}:",
        '    acc_ = tl.dot(_vf_round_bf(p_), _vf_bf2f(v_), acc_, input_precision="ieee")',
        "else:",
        "    acc_ = tl.dot(_vf_f2bf(p_), v_, acc_)",
    ]


def _key_block(k: ContractionKernel, program: Program, causal: bool, cast: str) -> list[str]:
    """The body of the loop over key blocks: scores, online softmax, O += P V."""
    g = k.gpu
    assert g is not None
    d, lk, dv = k.shapes[0][-1], k.shapes[1][-2], k.shapes[2][-1]
    pk, pv = param(k.operands[1]), param(k.operands[2])
    loop = [
        f"rn_ = n0_ + tl.arange(0, {g.block_n})",
        f"kt_ = tl.load({pk} + kh_ * {lk * d} + rn_[None, :] * {d} + rd_[:, None], "
        f"mask=(rn_ < {lk})[None, :] & (rd_ < {d})[:, None], other=0.0){cast}",
        *_scores(k, program, causal),
        "mn_ = tl.maximum(mi_, tl.reduce(s_, 1, _vf_max))",
        # a row with no key kept yet has max -inf: shift by 0 so exp gives 0, not NaN
        'ms_ = tl.where(mn_ == float("-inf"), 0.0, mn_)',
        "p_ = tl.exp(s_ - ms_[:, None])",
        "alpha_ = tl.exp(mi_ - ms_)",
        "li_ = li_ * alpha_ + tl.reduce(p_, 1, _vf_add)",
        *_dropout(k),
        "acc_ = acc_ * alpha_[:, None]",
        f"v_ = tl.load({pv} + kh_ * {lk * dv} + rn_[:, None] * {dv} + rv_[None, :], "
        f"mask=(rn_ < {lk})[:, None] & (rv_ < {dv})[None, :], other=0.0){cast}",
        *_pv(g.dot),
        "mi_ = mn_",
    ]
    return loop


def render_attention(
    k: ContractionKernel, program: Program, faults: FaultTable
) -> tuple[list[str], list[str], list[str]]:
    """(function lines, parameter names, values bound) of an SDPA template."""
    g = k.gpu
    assert g is not None
    q, kv = k.shapes[0], k.shapes[1]
    heads, lq, d = q[-3], q[-2], q[-1]
    hkv, lk, dv = kv[-3], kv[-2], k.shapes[2][-1]
    bd, bdv = _pow2(d), _pow2(dv)
    scale = k.attrs["scale"] if k.attrs["scale"] is not None else 1.0 / math.sqrt(d)
    causal = bool(k.attrs["causal"])
    tiles = -(-lq // g.block_m)
    pq = param(k.operands[0])
    cast = ".to(tl.float32)" if g.dot == "fp32" else ""
    # causal: the last key block a query block sees is the one holding its last row's diagonal
    stop = f"tl.minimum((tm_ + 1) * {g.block_m}, {lk})" if causal else str(lk)
    body = [
        "pid_ = tl.program_id(0).to(tl.int64)" if g.wide else "pid_ = tl.program_id(0)",
        f"bh_ = pid_ // {tiles}",
        f"tm_ = pid_ % {tiles}",
        f"b_ = bh_ // {heads}",
        f"h_ = bh_ % {heads}",
        f"kh_ = b_ * {hkv} + h_ // {heads // hkv}",
        f"rm_ = tm_ * {g.block_m} + tl.arange(0, {g.block_m})",
        "mm_ = rm_ < " + str(lq),
        f"rd_ = tl.arange(0, {bd})",
        f"rv_ = tl.arange(0, {bdv})",
        f"q_ = tl.load({pq} + bh_ * {lq * d} + rm_[:, None] * {d} + rd_[None, :], "
        f"mask=mm_[:, None] & (rd_ < {d})[None, :], other=0.0){cast}",
        f"scale_ = {float(scale)!r}",
        f'mi_ = tl.full([{g.block_m}], float("-inf"), tl.float32)',
        f"li_ = tl.full([{g.block_m}], 0.0, tl.float32)",
        f"acc_ = tl.full([{g.block_m}, {bdv}], 0.0, tl.float32)",
        *_dropout_setup(k, program),
        f"for n0_ in range(0, {stop}, {g.block_n}):",
    ]
    loop = _key_block(k, program, causal, cast)
    lines = ["    " + ln for ln in body] + ["        " + ln for ln in loop if ln]
    rate = sdpa_dropout(k.attrs)
    keep = f" * {1.0 / (1.0 - rate)!r}" if rate else ""  # kept values scaled by 1 / (1 - p), as dropout
    lines += [
        f"    v = acc_ / tl.where(li_ == 0.0, 1.0, li_)[:, None]{keep}",
        f"    om_ = mm_[:, None] & (rv_ < {dv})[None, :]",
    ]
    lines += epilogue(Section(k, program, faults), f"(bh_ * {lq} + rm_)[:, None]", "rv_[None, :]", dv, "om_")
    names, values = signature_params(k, program)
    return lines, names, values
