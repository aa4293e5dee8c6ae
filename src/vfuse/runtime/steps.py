"""What every executor of a scheduled Program shares, whatever runs its kernels (generated C++,
Triton): the torch steps between kernels, reading values that kernels left in the arena, and
returning results that never alias the arena or a constant."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from vfuse import interp
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Graph, Kind, Node, Op, TensorType
from vfuse.schedule import BufKind, Program, TorchStep

# torch's packed-weight sgemm (MKL builds on x86; aarch64 builds have none: the plain GEMM then).
MKL_PACKED = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


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


def drops_after_steps(program: Program, graph: Graph, slots: dict[str, list[tuple[str, int]]]) -> list[tuple[str, ...]]:
    """Per step, the values no later step and no output reads: the general path drops them from
    its environment after that step, so a torch step's result (a copy, a CAT) is freed at its
    last use instead of when the call returns. `slots`: the values each segment binds."""
    last: dict[str, int] = {}
    for i, step in enumerate(program.steps):
        if isinstance(step, TorchStep):
            used = [v for n in step.nodes for v in (n, *graph[n].inputs)]
        else:
            used = [v for v, _ in slots[step.name]]
        last.update((v, i) for v in used)
    drops: list[list[str]] = [[] for _ in program.steps]
    for v, i in last.items():
        if not graph.is_output(v):
            drops[i].append(v)
    return [tuple(d) for d in drops]


def _check_planned(node: Node, out: torch.Tensor, planned: TensorType) -> None:
    """A kernel reads a torch step's result through a raw pointer at its planned shape and dtype:
    any other result (a shape rule that disagrees with torch) would be read out of bounds."""
    shape = planned.shape
    if all(type(d) is int for d in shape) and (tuple(out.shape) != shape or out.dtype != planned.dtype.torch):
        raise RuntimeError(
            f"vfuse: node %{node.name} ({node.op.value}) ran through torch and gave {tuple(out.shape)} "
            f"{out.dtype}, but the compiled program planned {shape} {planned.dtype.torch} for its kernels "
            "(a vfuse bug: please report it)"
        )


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
            args = [local[i] if i in local else self._get(i, env) for i in node.inputs]
            out = self._packed_gemm(name, *args) if name in step.packed else None
            out = interp.run_node(node, args) if out is None else out
            if isinstance(out, torch.Tensor) and name in self.program.buffers:
                out = out.contiguous()  # kernels read row-major
                _check_planned(node, out, self.program.buffers[name].type)
            local[name] = out
        inside = set(step.nodes)
        for name, out in local.items():
            # A node the planner recomputes here but a kernel also writes keeps the kernel's buffer.
            b = self.program.buffers.get(name)
            if b is not None and b.kind is not BufKind.INPUT:
                continue
            if isinstance(out, torch.Tensor) and self._in_arena(out):
                # A view of the arena must not outlive the bytes it views: copied when a later
                # step or the caller reads it (a reshape feeding a conv in this step is not).
                if not self.graph.is_output(name) and all(u in inside for u in self.graph.users(name)):
                    continue
                out = out.clone()
            env[name] = out

    def _packed_gemm(self, name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """a @ b with the constant b packed once for MKL's sgemm (`schedule/packed.py`; None where torch
        has no MKL, or for an A of another row count than the one packed for: torch's plain GEMM)."""
        packs: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = self.__dict__.setdefault("_packs", {})
        if name not in packs:
            if not MKL_PACKED:
                return None
            w = b.t().contiguous()  # (N, K): torch's linear weight
            packs[name] = (w, torch.ops.mkl._mkl_reorder_linear_weight(w, a.shape[0]), a.shape[0])
        w, packed, rows = packs[name]
        if a.shape[0] != rows:
            return None
        return torch.ops.mkl._mkl_linear(a.contiguous(), packed, w, None, rows)

    def _in_arena(self, t: torch.Tensor) -> bool:
        a = self._arena
        return a is not None and t.numel() > 0 and t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()

    def _result(self, value: str, env: dict[str, Any]) -> Any:
        out = self._get(value, env)
        # The user may modify what we return: neither the arena nor a constant may be handed out.
        if isinstance(out, torch.Tensor) and (self._in_arena(out) or self.graph[value].op is Op.CONSTANT):
            out = out.clone()
        return out
