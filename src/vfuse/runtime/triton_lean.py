"""The lean per-call path of a Triton program made of kernels only (no torch steps, no fault
records): on a GPU a launch-bound graph spends most of its call in Python (measured on an H200:
vfuse 24.6 us per call of a one-kernel graph against eager's 20.3 us for three kernels).

Decided once per program (`LeanPlan`): which graph input, output buffer or fixed tensor (arena
view, constant, seeds) each kernel parameter reads, and which output buffer each graph output
is. Bound once per device (`bind`): the fixed tensors and each launch's callable. A call then
makes the kernel-read inputs contiguous (channels-last for NHWC convs), allocates the outputs,
and launches: no name-keyed environment, no per-value lookups. Programs that need more keep
`TritonExecutor`'s general path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vfuse.codegen.triton.render import Launch, TritonProgram
from vfuse.ir import Graph
from vfuse.schedule import BufKind, Program, TorchStep

INPUT, OUTPUT, FIXED = 0, 1, 2
Source = tuple[int, object]  # (INPUT, position in LeanPlan.inputs) | (OUTPUT, index) | (FIXED, value name)


@dataclass(frozen=True)
class LeanPlan:
    inputs: tuple[int, ...]  # graph input positions the kernels read, in first-use order
    outputs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]  # output buffers: (value, shape, dtype)
    launches: tuple[tuple[Launch, tuple[Source, ...]], ...]
    results: tuple[int, ...]  # for each graph output, its index in `outputs`
    channels_last: tuple[bool, ...] = ()  # per entry of `inputs`: bound channels-last (an NHWC conv's)


def make_lean_plan(program: Program, graph: Graph, rendered: TritonProgram) -> LeanPlan | None:
    """The lean plan, or None when the program needs the general path (torch steps, fault
    records read after each segment, a graph output no kernel writes)."""
    if any(isinstance(s, TorchStep) for s in program.steps) or rendered.faults or not rendered.launches:
        return None
    outputs = [(v, b.type.shape, b.type.dtype.torch) for v, b in program.buffers.items() if b.kind is BufKind.OUTPUT]
    index = {v: i for i, (v, _, _) in enumerate(outputs)}
    if any(o not in index for o in graph.outputs):
        return None
    position = {n.name: n.attrs["index"] for n in graph.inputs}
    inputs: list[int] = []
    launches = []
    for ln in rendered.launches:
        sources: list[Source] = []
        for v in ln.args:
            if v in position:
                if position[v] not in inputs:
                    inputs.append(position[v])
                sources.append((INPUT, inputs.index(position[v])))
            elif v in index:
                sources.append((OUTPUT, index[v]))
            else:
                sources.append((FIXED, v))
        launches.append((ln, tuple(sources)))
    results = tuple(index[o] for o in graph.outputs)
    names = {i: n for n, i in position.items()}
    nhwc = tuple(names[i] in rendered.channels_last for i in inputs)
    return LeanPlan(tuple(inputs), tuple(outputs), tuple(launches), results, nhwc)


LeanCall = Callable[[Sequence[torch.Tensor], "dict[str, torch.Tensor] | None"], list[torch.Tensor]]


def bind(
    plan: LeanPlan,
    device: torch.device,
    fixed: Callable[[str], torch.Tensor],
    launcher: Callable[[Launch], Callable[[Sequence[torch.Tensor]], None]],
) -> LeanCall:
    """The per-call function of `plan` on `device`: `fixed` resolves arena views, constants,
    seeds; `launcher` gives each launch's callable (the lean CUDA launcher or the interpreter)."""
    steps = [
        (launcher(ln), [(kind, fixed(key) if kind == FIXED else key) for kind, key in sources])  # type: ignore[arg-type]
        for ln, sources in plan.launches
    ]
    positions, specs, results = plan.inputs, plan.outputs, plan.results
    nhwc = plan.channels_last or (False,) * len(positions)
    formats = [torch.channels_last if cl else torch.contiguous_format for cl in nhwc]

    def call(inputs: Sequence[torch.Tensor], given: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
        ins = [inputs[i].contiguous(memory_format=f) for i, f in zip(positions, formats, strict=True)]
        if given is None:
            outs = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in specs]
        else:
            outs = [given[v] for v, _, _ in specs]
        for run, sources in steps:
            run([ins[k] if kind == INPUT else outs[k] if kind == OUTPUT else k for kind, k in sources])  # type: ignore[index]
        return [outs[i] for i in results]

    return call
