"""TritonExecutor: runs a Program's segments as Triton kernel launches, torch steps in between.

The compiler hands it the Program and its rendered Triton module (`codegen/triton`); it loads
the module (interpreted for CPU tensors: Triton's interpreter runs the kernels with numpy; a
GPU run will load the same file jit-compiled), allocates the arena (intermediates as typed
views of one byte buffer), the seeds array and the fault record. Each call: draw the RNG
seeds, bind inputs (contiguous), allocate outputs from the pool, then per step launch the
segment's kernels in order (index checks first) or run torch; after a segment, a fault a
kernel recorded is raised as eager raises it, naming the node.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vfuse import interp
from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.offline import Resources, compile_kernel, resources_of
from vfuse.codegen.triton.render import Launch, TritonProgram
from vfuse.codegen.triton.writer import FAULTS, SEEDS, FaultKind
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Op
from vfuse.ir.defs.layout import index_out_of_bounds
from vfuse.ir.defs.pointwise import integer_division_by_zero
from vfuse.runtime.compiled import ExecStats
from vfuse.runtime.pool import OutputPool
from vfuse.runtime.steps import StepRunner, fallback_counts, torch_nodes
from vfuse.schedule import BufKind, Program, Segment

NO_FAULT = 2**63 - 1
ARENA_ALIGN = 64


@dataclass(frozen=True)
class TritonKernel:
    """One generated function, as the issue's API names it: `source` is the whole module
    (its helpers included), `resources()` the offline compile's figures for an SM."""

    name: str
    source: str
    signature: dict[str, str]
    warps: int
    path: Path

    def resources(self, sm: int = 90) -> dict[str, int]:
        """{"registers", "spill_bytes", "shared_bytes"} of this kernel compiled for `sm` (no GPU needed)."""
        return self.compiled(sm).as_dict()

    def compiled(self, sm: int = 90) -> Resources:
        module = load_module(self.path, interpret=False)
        return resources_of(compile_kernel(module, self.name, self.signature, self.warps, sm), sm)


class TritonExecutor(StepRunner):
    """Callable `(inputs) -> outputs` for one FusionPlan's Program rendered as Triton kernels."""

    def __init__(
        self, plan: FusionPlan, program: Program, rendered: TritonProgram, cache_dir: Path, static_outputs: bool = False
    ) -> None:
        self.plan, self.graph, self.program, self.rendered = plan, plan.graph, program, rendered
        self.source = rendered.source
        self.path = module_path(rendered.source, cache_dir)
        self._module = load_module(self.path, interpret=True)
        self.kernels = [
            TritonKernel(ln.fn, rendered.source, rendered.signatures[ln.fn], ln.warps, self.path)
            for ln in rendered.launches
        ]
        self._arena: torch.Tensor | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._constants: dict[str, torch.Tensor] = {}
        self._static = static_outputs
        self._pool = OutputPool()
        self._lock = threading.Lock()
        self.stats = ExecStats(
            "triton",
            kernels=len(rendered.launches),
            native_calls=len(program.segments),
            torch_calls=torch_nodes(program),
            arena_bytes=program.memory.size,
            fallbacks=fallback_counts(program, plan),
        )

    def _allocate(self) -> None:
        """Arena, seeds and fault record: on the first call (compilation may run under fake tensors)."""
        self._arena = torch.empty(self.program.memory.size + ARENA_ALIGN, dtype=torch.uint8)
        off = -self._arena.data_ptr() % ARENA_ALIGN
        for v, b in self.program.buffers.items():
            if b.kind is BufKind.ARENA:
                raw = self._arena[off + b.slot : off + b.slot + b.type.nbytes]
                self._views[v] = raw.view(b.type.dtype.torch).view(b.type.shape)
        self._seeds = torch.zeros(max(len(self.program.seeds), 1), dtype=torch.int64)
        self._faults = torch.full((max(len(self.rendered.faults), 1),), NO_FAULT, dtype=torch.int64)
        self._constants = {
            n.name: n.attrs["value"].tensor.contiguous() for n in self.graph.nodes if n.op is Op.CONSTANT
        }

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        with self._lock:  # the arena, seeds and fault record are shared: one call at a time
            if self._arena is None:
                self._allocate()
            env: dict[str, Any] = dict(self._constants)
            for n in self.graph.inputs:
                env[n.name] = inputs[n.attrs["index"]].contiguous()
            for node in self.graph.nodes:
                if node.op is Op.RNG_SEED:  # drawn in graph order, as the reference executor does
                    env[node.name] = interp.run_node(node, [])
            for k, name in enumerate(self.program.seeds):
                self._seeds[k] = env[name]
            for v, b in self.program.buffers.items():
                if b.kind is BufKind.OUTPUT:
                    env[v] = self._pool.get(v, b.type.shape, b.type.dtype.torch, static=self._static)
            for step in self.program.steps:
                if isinstance(step, Segment):
                    self._run_segment(step, env)
                else:
                    self._run_torch(step, env)
            return [self._result(o, env) for o in self.graph.outputs]

    def _run_segment(self, seg: Segment, env: dict[str, Any]) -> None:
        for ln in self.rendered.segments[seg.name]:
            self._launch(ln, env)
        if self.rendered.faults and int(self._faults.min()) != NO_FAULT:
            raise self._fault(env)

    def _launch(self, ln: Launch, env: dict[str, Any]) -> None:
        args = [self._arg(v, env) for v in ln.args]
        # The interpreter computes with numpy, which warns where IEEE arithmetic gives inf / NaN
        # (masked lanes, log(0), ...) and eager torch does not.
        with np.errstate(all="ignore"):
            getattr(self._module, ln.fn)[(ln.grid,)](*args, num_warps=ln.warps)

    def _arg(self, value: str, env: dict[str, Any]) -> torch.Tensor:
        if value == SEEDS:
            return self._seeds
        if value == FAULTS:
            return self._faults
        return self._get(value, env)

    def _fault(self, env: dict[str, Any]) -> Exception:
        """The exception of the first fault site that fired (launch order), as eager raises it."""
        slots = self._faults.tolist()
        self._faults.fill_(NO_FAULT)
        site = next(s for s in self.rendered.faults if slots[s.slot] != NO_FAULT)
        node = self.graph[site.node]
        if site.kind is FaultKind.ZERO_DIVISION:
            return interp.located(node, integer_division_by_zero())
        value = int(self._arg(site.buf, env).reshape(-1)[slots[site.slot]])
        return interp.located(node, index_out_of_bounds(value, node.attrs.get("dim", 0), site.rows))

    def _get(self, value: str, env: dict[str, Any]) -> Any:
        return env[value] if value in env else self._views[value]
