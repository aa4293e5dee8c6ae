"""What every executor of a scheduled Program shares, whatever runs its kernels (generated C++,
Triton): the torch steps between kernels, reading values that kernels left in the arena, and
returning results that never alias the arena or a constant."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from vfuse import interp
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Graph, Kind, Op
from vfuse.schedule import BufKind, Program, TorchStep


def fallback_counts(program: Program, plan: FusionPlan) -> Counter[str]:
    """Nodes run through torch that a native backend would compile: OPAQUE ops and fallbacks."""
    out: Counter[str] = Counter()
    for s in program.steps:
        if not isinstance(s, TorchStep):
            continue
        for n in s.nodes:
            node = plan.graph[n]
            if node.op is Op.OPAQUE:
                out[str(node.attrs["call"])] += 1
            elif s.reason.startswith("fallback") and node.kind is not Kind.CONTRACTION:
                out[node.op.value] += 1
    return out


def torch_nodes(program: Program) -> int:
    return sum(len(s.nodes) for s in program.steps if isinstance(s, TorchStep))


class StepRunner:
    """Base of the program executors; a subclass says where a value lives (`_get`)."""

    graph: Graph
    program: Program
    _arena: torch.Tensor | None

    def _get(self, value: str, env: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _run_torch(self, step: TorchStep, env: dict[str, Any]) -> None:
        local: dict[str, Any] = {}
        for name in step.nodes:
            node = self.graph[name]
            out = interp.run_node(node, [local[i] if i in local else self._get(i, env) for i in node.inputs])
            if isinstance(out, torch.Tensor):
                if self._in_arena(out):
                    out = out.clone()  # a view of the arena must not outlive the bytes it views
                if name in self.program.buffers:
                    out = out.contiguous()  # kernels read row-major
            local[name] = out
        for name, out in local.items():
            # A node the planner recomputes here but a kernel also writes keeps the kernel's buffer.
            b = self.program.buffers.get(name)
            if b is None or b.kind is BufKind.INPUT:
                env[name] = out

    def _in_arena(self, t: torch.Tensor) -> bool:
        a = self._arena
        return a is not None and t.numel() > 0 and t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()

    def _result(self, value: str, env: dict[str, Any]) -> Any:
        out = self._get(value, env)
        # The user may modify what we return: neither the arena nor a constant may be handed out.
        if isinstance(out, torch.Tensor) and (self._in_arena(out) or self.graph[value].op is Op.CONSTANT):
            out = out.clone()
        return out
