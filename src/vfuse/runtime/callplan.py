"""The lean per-call path of a program made of native segments only (the common case).

A call then only has to point the kernels at this call's tensors: every input's data pointer
(made contiguous first: kernels index row-major), every output's (from the pool), the seeds
when the program draws random numbers, and one foreign call per segment. All of that is
decided here once, when the executor is built: which input index and which output feed
which pointer slot, which outputs the graph returns. Constants have fixed addresses and are
bound once, so a call builds no name-keyed environment and looks nothing up by name.

A graph input the graph also returns (AOTAutograd's forward returns the inputs its backward
saves) is handed back as the general path hands it back: the tensor itself, or its contiguous
copy. Programs with torch steps (OPAQUE nodes, fallbacks) or that return something else no
kernel writes (a constant, a view) keep the general path in `NativeExecutor`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vfuse.ir import Graph, Op
from vfuse.schedule import BufKind, Program, TorchStep


@dataclass(frozen=True)
class CallPlan:
    """Where each per-call tensor goes; indices refer to the graph's inputs and outputs."""

    inputs: tuple[tuple[int, int], ...]  # (pointer slot, graph input position)
    outputs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]  # (pool key, shape, dtype)
    output_slots: tuple[int, ...]
    results: tuple[int, ...]  # for each graph output, its position in `outputs`; -1 - i: graph input i
    draws_seeds: bool
    in_order: bool = False  # `results` is 0, 1, ...: the outputs are returned as the pool gives them


def make_call_plan(program: Program, graph: Graph) -> CallPlan | None:
    """The lean plan, or None when the program needs the general path."""
    if any(isinstance(s, TorchStep) for s in program.steps) or not program.segments:
        return None
    bufs = program.buffers
    written = [v for v, b in bufs.items() if b.kind is BufKind.OUTPUT]
    if any(v not in written and graph[v].op is not Op.INPUT for v in graph.outputs):
        return None
    # Inputs no kernel reads have no slot: they need no binding.
    bound = [n for n in graph.inputs if n.name in bufs]
    results = tuple(written.index(v) if v in written else -1 - int(graph[v].attrs["index"]) for v in graph.outputs)
    return CallPlan(
        inputs=tuple((bufs[n.name].slot, int(n.attrs["index"])) for n in bound),
        outputs=tuple((v, bufs[v].type.shape, bufs[v].type.dtype.torch) for v in written),
        output_slots=tuple(bufs[v].slot for v in written),
        results=results,
        draws_seeds=any(n.op is Op.RNG_SEED for n in graph.nodes),
        in_order=results == tuple(range(len(written))),
    )
