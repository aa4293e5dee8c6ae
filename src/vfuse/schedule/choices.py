"""The schedule's size-dependent choices for each kernel, as text people read.

Over symbolic sizes the schedule takes its performance choices (threads, walk, row groups,
prefetch distance, row buffers, reductions, transpose tiles, register tiles) at the hints
(`ir/sym.hint`, no guard). `kernel_choices` names them per kernel so that `fusion.flips.size_flips`
can schedule the plan again at other sizes and report those that change within the range;
`per_call_choices` lists the choices a kernel makes per call instead (`gates.SizeGate`: streamed
stores, threads, row prefetch; a GEMM's cache blocks over a symbolic M, `blocks.CallBlocks`).
A GEMM's or conv's cache blocks and its template's other blocks are named with the kernel's choices.
"""

from __future__ import annotations

from vfuse.ir import Op
from vfuse.ir.sym import SymSize, hint, pretty
from vfuse.schedule.blocks import describe, describe_per_call
from vfuse.schedule.conv_blocks import conv_gemm_mnk
from vfuse.schedule.conv_fold import folded_mnk
from vfuse.schedule.gates import LINE, SizeGate
from vfuse.schedule.kernel import ContractionKernel, Kernel, Pass, Program, Segment, TorchStep


def kernel_choices(program: Program) -> dict[str, str]:
    """`"k3 (softmax) prefetch"` -> `"3 rows ahead"`, ...: each kernel's choices; torch steps by their nodes."""
    out: dict[str, str] = {}
    for step in program.steps:
        if isinstance(step, TorchStep):
            out[f"torch step ({', '.join(step.nodes)})"] = step.reason
            continue
        assert isinstance(step, Segment)
        for k in step.kernels:
            name = f"{k.name} ({k.label})"
            choices = _contraction(k) if isinstance(k, ContractionKernel) else _kernel(k)
            out.update({f"{name} {what}": value for what, value in choices.items()})
    return out


def per_call_choices(program: Program) -> list[str]:
    """One line per kernel choice taken per call (not at the hints): streamed stores, threads,
    row prefetch (where its distance, or whether it prefetches at all, follows the sizes)."""
    out = []
    for k in program.kernels:
        blocks = k.gemm_blocks if isinstance(k, ContractionKernel) and k.int8 is None else None
        if blocks is not None and len(blocks.blocks) > 1:
            a = k.shapes[0]
            how = describe_per_call(blocks, hint(k.out_shape[-1]), hint(a[-1]))
            out.append(f"{k.name} ({k.label}) GEMM blocks: chosen per call, {how}")
        if not isinstance(k, Kernel):
            continue
        name = f"{k.name} ({k.label})"
        if k.stream_gate is not None:
            out.append(f"{name} stores: chosen per call, streamed where {_where(k.stream_gate, 'bytes')}")
        if k.thread_gate is not None:
            out.append(f"{name} threads: chosen per call, several where {_where(k.thread_gate, 'loop points')}")
        if k.at_hint is not None:  # schedule/rowhint.py
            sizes = " and ".join(f"{s} = {h}" for s, h in k.at_hint.sizes)
            out.append(f"{name} row length: chosen per call, a copy where {sizes} ({_copy(k.at_hint.kernel)})")
        if k.prefetch is not None and k.prefetch.per_call:
            pf = k.prefetch
            where = f" where {_where(pf.gate, '')}" if pf.gate is not None else ""
            out.append(f"{name} prefetch: chosen per call, {pretty(pf.distance)} rows ahead{where}")
    return out


def _copy(k: Kernel) -> str:
    """How a row kernel's copy at the hint walks: `rows, reductions lanes x32; strips x1`."""
    return f"{k.walk.value}, reductions " + "; ".join(_reduction(p) for p in k.passes if p.reduces)


def _where(gate: SizeGate, unit: str) -> str:
    """`768*s0 >= 65536 bytes and ...`: a gate's tests, those against its own limit in `unit`."""
    units = f" {unit}" if unit else ""
    return gate.text(
        lambda moved, limit: f"{pretty(moved)} >= {limit}" + (units if moved is gate.moved else ""),
        lambda a: f"{pretty(a)} % {LINE} == 0",
        " and ",
        " or ",
    )


def _kernel(k: Kernel) -> dict[str, str]:
    out = {
        "walk": k.walk.value + (f" of {k.row_group}" if k.row_group else ""),
        "threads": "per call" if k.thread_gate is not None else "several" if k.threaded else "one",
        "stores": "per call" if k.stream_gate is not None else "streamed" if k.stream else "cached",
        "prefetch": _prefetch(k),
    }
    buffered = sorted(v for p in k.passes for v in p.buffered)
    if any(p.reduces for p in k.passes) or buffered:
        out["row buffers"] = ", ".join(buffered) or "none"
        out["reductions"] = "; ".join(_reduction(p) for p in k.passes if p.reduces)
    if k.transpose:
        out["tiles"] = f"{k.transpose.rows}x{k.transpose.cols}"
    for i, part in enumerate(k.parts):
        out.update({f"part {i} {what}": value for what, value in _kernel(part).items()})
    return out


def _prefetch(k: Kernel) -> str:
    if k.prefetch is None:
        return "none"
    return "per call" if k.prefetch.per_call else f"{k.prefetch.distance} rows ahead"


def _reduction(p: Pass) -> str:
    r = p.reduction
    return r.kind.value + (f" x{r.chains}" if r.chains else f" x{r.lanes}" if r.lanes else "")


def _contraction(k: ContractionKernel) -> dict[str, str]:
    out = {"register tile": f"{k.mr}x{k.nr}", "blocks": "x".join(map(str, k.blocks))}
    return {**out, **_template_blocks(k)}


def _template_blocks(k: ContractionKernel) -> dict[str, str]:
    """A CPU GEMM's or conv's cache blocks, by the regime they put M, K and N in (`"M in one block, K
    in blocks of 512, N in blocks of 1536"`, at the hints; `"per call"` where `blocks.CallBlocks`
    has pieces), whether a GEMM packs A once per call, a conv's path and its direct path's channel blocks, a folded
    weight gradient's threaded passes: what the templates render (codegen/cpp/gemm/)."""
    out: dict[str, str] = {}
    if k.gemm_blocks is not None and k.int8 is None:
        b = k.gemm_blocks.blocks[0]
        per_call = len(k.gemm_blocks.blocks) > 1
        m, n, kk = (hint(d) for d in _gemm_mnk(k))
        out["GEMM blocks"] = "per call" if per_call else describe(b, m, n, kk)
    if k.op is Op.MATMUL and k.gpu is None and k.int8 is None:
        out["A packing"] = "once per call" if k.shared_a else "per block"
    if k.int8 is not None:
        out["int8 row slivers"] = f"{k.int8.mcb} per work item"
    c = k.conv_blocks
    if c is not None and k.attrs.get("folded"):
        out["threaded passes"] = (
            ", ".join(p for p, t in (("transpose", c.threaded_transpose), ("scatter", c.threaded_scatter)) if t)
            or "none"
        )
    elif c is not None:
        out["conv path"] = "direct" if c.direct else "implicit GEMM"
        out["channel blocks"] = f"{c.icb} in, {c.mb} out"
        out["weight packing"] = "once per call" if c.weight_once else "per image"
    return out


def _gemm_mnk(k: ContractionKernel) -> tuple[SymSize | int, SymSize | int, SymSize | int]:
    """M, N, K of the GEMM a MATMUL or conv template runs (conv: per image and group, or folded)."""
    if k.op is Op.MATMUL:
        a = k.shapes[0]
        return a[-2], k.out_shape[-1], a[-1]
    x, w = k.shapes[:2]
    if k.attrs.get("folded"):
        return folded_mnk(x, w, k.out_shape, k.attrs["groups"])
    return conv_gemm_mnk(k.attrs, w, k.out_shape)
