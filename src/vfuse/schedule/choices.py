"""The schedule's size-dependent choices for each kernel, as text people read.

Over symbolic sizes the schedule takes its performance choices (threads, walk, row groups,
prefetch distance, row buffers, reductions, transpose tiles, register tiles) at the hints
(`ir/sym.hint`, no guard). `kernel_choices` names them per kernel so that `fusion.flips.size_flips`
can schedule the plan again at other sizes and report those that change within the range;
`per_call_choices` lists the choices a kernel makes per call instead (`gates.SizeGate`: streamed
stores, threads, row prefetch; a GEMM's cache blocks over a symbolic M, `blocks.CallBlocks`).
GEMM cache blocks at the hints are named by `codegen/cpp/contraction.gemm_choices`, which the
report adds.
"""

from __future__ import annotations

from vfuse.ir.sym import hint, pretty
from vfuse.schedule.blocks import describe_per_call
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
        if k.prefetch is not None and k.prefetch.per_call:
            pf = k.prefetch
            where = f" where {_where(pf.gate, '')}" if pf.gate is not None else ""
            out.append(f"{name} prefetch: chosen per call, {pretty(pf.distance)} rows ahead{where}")
    return out


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
    return {"register tile": f"{k.mr}x{k.nr}", "blocks": "x".join(map(str, k.blocks))}
