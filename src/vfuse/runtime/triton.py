"""TritonExecutor: runs a Program's segments as Triton kernel launches, torch steps in between.

The compiler hands it the Program and its rendered Triton module (`codegen/triton`). Memory is
kept per device (`_Memory`): for CPU tensors the module is loaded for Triton's interpreter (the
kernels run with numpy), for CUDA tensors jit-compiled and launched through `LeanLaunch` (the
compiled kernel called directly, without `JITFunction.run`'s argument binding). Each memory holds
the arena (intermediates as typed views of one byte buffer), the seeds array and the fault record.
Each call: draw the RNG seeds, bind inputs (contiguous where a kernel reads them), allocate
outputs, then per step launch the segment's kernels in order (index checks first) or run torch;
after a segment, a fault a kernel recorded is raised as eager raises it, naming the node. CUDA calls go through
`runtime.cudagraphs.GraphRunner` (warm-up, capture per input-shape key, replay) unless the
`cuda_graphs` option is off or the program cannot be captured (`capture_blocker`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from vfuse import interp
from vfuse.codegen.triton.autotune import Autotuner, Timer, cuda_timer
from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.offline import Resources, compile_kernel, precompile, resources_of
from vfuse.codegen.triton.render import Launch, TritonProgram, render
from vfuse.codegen.triton.writer import FAULTS, SEEDS, FaultKind
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Op
from vfuse.ir.defs.layout import index_out_of_bounds
from vfuse.ir.defs.pointwise import integer_division_by_zero
from vfuse.runtime.compiled import ExecStats
from vfuse.runtime.cudagraphs import CudaDriver, GraphDriver, GraphRunner, ReplayCost, capture_blocker
from vfuse.runtime.pool import OutputPool
from vfuse.runtime.steps import StepRunner, fallback_counts, torch_nodes
from vfuse.runtime.triton_lean import LeanCall, bind, make_lean_plan
from vfuse.schedule import BufKind, Program, Segment, TorchStep
from vfuse.schedule.kernel import ContractionKernel, GpuTiles
from vfuse.targets.presets import PRESETS

NO_FAULT = 2**63 - 1
ARENA_ALIGN = 64
POINTER_ALIGN = 16  # Triton specializes a pointer argument on divisibility by 16


@dataclass(frozen=True)
class TritonKernel:
    """One generated function, as the issue's API names it: `source` is the whole module
    (its helpers included), `resources()` the offline compile's figures for an SM."""

    name: str
    source: str
    signature: dict[str, str]
    warps: int
    path: Path
    stages: int = 0  # software-pipeline stages (templates); 0: Triton's default

    def resources(self, sm: int = 90) -> dict[str, int]:
        """{"registers", "spill_bytes", "shared_bytes"} of this kernel compiled for `sm` (no GPU needed)."""
        return self.compiled(sm).as_dict()

    def compiled(self, sm: int = 90) -> Resources:
        module = load_module(self.path, interpret=False)
        return resources_of(compile_kernel(module, self.name, self.signature, self.warps, sm, self.stages), sm)


class LeanLaunch:
    """One launch of a jit-compiled kernel on CUDA tensors. The first call with a given pointer
    alignment goes through `JITFunction.run` (which compiles and specializes the kernel); later
    calls call the returned compiled kernel's launcher directly, on the current stream. Kernels
    are kept per alignment key: Triton assumes 16-byte alignment where it compiled for it, so a
    misaligned input (a view with a storage offset) must not reuse that kernel."""

    def __init__(self, fn: Any, grid: int, warps: int, stream: Callable[[], int], stages: int = 0) -> None:
        self.fn, self.grid, self.stream = fn, grid, stream
        self.options = {"num_warps": warps, **({"num_stages": stages} if stages else {})}
        self.kernels: dict[tuple[bool, ...], Any] = {}

    def __call__(self, args: Sequence[torch.Tensor]) -> None:
        if not self.grid:
            return
        key = tuple(a.data_ptr() % POINTER_ALIGN == 0 for a in args)
        k = self.kernels.get(key)
        if k is None:
            self.kernels[key] = self.fn.run(*args, grid=(self.grid,), warmup=False, **self.options)
            return
        k.run(self.grid, 1, 1, self.stream(), k.function, k.packed_metadata, None, None, None, *args)


@dataclass(frozen=True)
class Tuning:
    """Autotuning of the contraction templates on a device (`codegen/triton/autotune.py`): the
    preset the cache is keyed by, the schedule's candidates for a kernel
    (`schedule.gpu.candidates` bound to the target) and the timer made for the cache folder
    (`cuda_timer`; tests pass a fake)."""

    preset: str
    candidates: Callable[[ContractionKernel], Sequence[GpuTiles]]
    timer: Callable[[Path], Timer] = cuda_timer


@dataclass
class _Memory:
    """What one device's calls share: the loaded module, arena views, seeds, fault record."""

    device: torch.device
    module: ModuleType
    arena: torch.Tensor
    views: dict[str, torch.Tensor]
    seeds: torch.Tensor
    faults: torch.Tensor
    constants: dict[str, torch.Tensor]
    rendered: TritonProgram  # the module this device runs (its templates' tiles tuned on CUDA)
    launchers: dict[int, Callable[[Sequence[torch.Tensor]], None]] = field(default_factory=dict)
    static: dict[str, torch.Tensor] = field(default_factory=dict)  # CUDA outputs with static_outputs
    lean: LeanCall | None = None  # the lean per-call path (runtime/triton_lean.py), where it applies


class TritonExecutor(StepRunner):
    """Callable `(inputs) -> outputs` for one FusionPlan's Program rendered as Triton kernels."""

    devices = ("cpu", "cuda")

    def __init__(
        self,
        plan: FusionPlan,
        program: Program,
        rendered: TritonProgram,
        cache_dir: Path,
        static_outputs: bool = False,
        cuda_graphs: bool = True,
        driver: Callable[[torch.device], GraphDriver] = CudaDriver,
        tuning: Tuning | None = None,
    ) -> None:
        self.plan, self.graph, self.program, self.rendered = plan, plan.graph, program, rendered
        self.source = rendered.source
        self.path = module_path(rendered.source, cache_dir)
        self.kernels = [
            TritonKernel(ln.fn, rendered.source, rendered.signatures[ln.fn], ln.warps, self.path, ln.stages)
            for ln in rendered.launches
        ]
        self._cache_dir, self.tuning = cache_dir, tuning
        self._kernel_reads = {v for ln in rendered.launches for v in ln.args}
        # Devices whose calls take the lean path where the program allows (tests add "cpu").
        self.lean_devices: tuple[str, ...] = ("cuda",)
        # Devices whose first call times the templates' candidates (never the interpreter: its
        # timings say nothing about a GPU; tests add "cpu" with a fake timer).
        self.tuned_devices: tuple[str, ...] = ("cuda",)
        self.autotuner: Autotuner | None = None
        # Devices whose first call compiles every kernel at once before launching any (CUDA: the
        # launches then load them from Triton's cache; tests add "cpu" with a fake `precompile`).
        self.precompiled_devices: tuple[str, ...] = ("cuda",)
        self.precompile = precompile
        self.precompile_s = 0.0  # wall seconds the last device's kernels took to compile ahead
        self.precompiled: Any = None  # what `precompile` returned: (fn, warps, stages) -> future
        self._memory: dict[torch.device, _Memory] = {}
        self._mem: _Memory | None = None
        self._arena = None
        self._static = static_outputs
        self._pool = OutputPool()
        self._lock = threading.Lock()
        self._drawn: dict[str, Any] = {}
        self._seed_nodes = [n for n in self.graph.nodes if n.op is Op.RNG_SEED]
        # CUDA calls go through a GraphRunner (tests point `driver` at a fake and add "cpu").
        self.driver = driver
        self.graph_devices: tuple[str, ...] = ("cuda",)
        self._graphs: dict[torch.device, GraphRunner] = {}
        self._routes: dict[torch.device, tuple[tuple[str, ...], GraphRunner | None]] = {}
        # Why CUDA calls run uncaptured ('' when they are captured).
        off = "the cuda_graphs option is off"
        self.graph_blocker = capture_blocker(self.graph, program, len(rendered.faults)) if cuda_graphs else off
        # Whether a replay beats its launches, per input-shape key (None: capture every key).
        self.replay_cost: ReplayCost | None = replay_cost(plan, program, len(rendered.launches))
        self.stats = ExecStats(
            "triton",
            kernels=len(rendered.launches),
            native_calls=len(program.segments),
            torch_calls=torch_nodes(program),
            arena_bytes=program.memory.size,
            fallbacks=fallback_counts(program, plan),
        )

    # -- memory per device -----------------------------------------------------------------
    def _memory_for(self, device: torch.device) -> _Memory:
        """Arena, seeds and fault record of `device`: made on its first call (compilation may
        run under fake tensors)."""
        mem = self._memory.get(device)
        if mem is None:
            mem = self._memory[device] = self._allocate(device)
        return mem

    def _allocate(self, device: torch.device) -> _Memory:
        arena = torch.empty(self.program.memory.size + ARENA_ALIGN, dtype=torch.uint8, device=device)
        off = -arena.data_ptr() % ARENA_ALIGN
        views = {}
        for v, b in self.program.buffers.items():
            if b.kind is BufKind.ARENA:
                raw = arena[off + b.slot : off + b.slot + b.type.nbytes]
                views[v] = raw.view(b.type.dtype.torch).view(b.type.shape)
        seeds = torch.zeros(max(len(self.program.seeds), 1), dtype=torch.int64, device=device)
        faults = torch.full((max(len(self.rendered.faults), 1),), NO_FAULT, dtype=torch.int64, device=device)
        constants = {
            n.name: n.attrs["value"].tensor.to(device).contiguous(memory_format=self._format(n.name))
            for n in self.graph.nodes
            if n.op is Op.CONSTANT
        }
        rendered, path = self._tuned(device)
        if device.type in self.precompiled_devices:
            start = time.perf_counter()
            self.precompiled = self.precompile(rendered, path, _sm(device))
            self.precompile_s = time.perf_counter() - start
        module = load_module(path, interpret=device.type == "cpu")
        mem = _Memory(device, module, arena, views, seeds, faults, constants, rendered)
        plan = make_lean_plan(self.program, self.graph, rendered) if device.type in self.lean_devices else None
        if plan is not None:
            mem.lean = bind(plan, device, lambda v: _fixed(mem, v), lambda ln: self._launcher(ln, mem))
        return mem

    def _format(self, value: str) -> torch.memory_format:
        """The memory format the kernels read `value` in (channels-last: an NHWC conv's x or w)."""
        return torch.channels_last if value in self.rendered.channels_last else torch.contiguous_format

    def _tuned(self, device: torch.device) -> tuple[TritonProgram, Path]:
        """The module `device` runs: on a tuned device with contraction templates, their tiles
        timed there (or read from the autotune cache) and the program rendered again with them."""
        contractions = any(isinstance(k, ContractionKernel) for k in self.program.kernels)
        if self.tuning is None or device.type not in self.tuned_devices or not contractions:
            return self.rendered, self.path
        t = self.tuning
        self.autotuner = Autotuner(self._cache_dir, t.timer(self._cache_dir))
        program = self.autotuner.tune(self.program, t.preset, t.candidates)
        if program == self.program:
            return self.rendered, self.path
        rendered = render(program)
        path = module_path(rendered.source, self._cache_dir)
        # what runs is what `source` and `kernels` show (resources() of the tuned tiles)
        self.source = rendered.source
        self.kernels = [
            TritonKernel(ln.fn, rendered.source, rendered.signatures[ln.fn], ln.warps, path, ln.stages)
            for ln in rendered.launches
        ]
        return rendered, path

    # -- calls -----------------------------------------------------------------------------
    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        with self._lock:  # the arena, seeds and fault record are shared: one call at a time
            device = inputs[0].device if inputs else torch.device("cpu")
            self._mem = self._memory_for(device)
            self._arena = self._mem.arena
            # The device's route (its graph runner, or None: launched) is kept per call path:
            # `device.type` alone costs ~1 us, a replay ~5 (tests change `graph_devices`).
            route = self._routes.get(device)
            if route is None or route[0] is not self.graph_devices:
                route = self._routes[device] = (
                    self.graph_devices,
                    self._runner(device) if device.type in self.graph_devices else None,
                )
            if route[1] is None:
                self.seed()
                return self.launch(inputs, None)
            return route[1](inputs)

    def _runner(self, device: torch.device) -> GraphRunner:
        runner = self._graphs.get(device)
        if runner is None:
            blocker = self.graph_blocker
            runner = GraphRunner(self, self.driver(device), self._static, blocker, self.replay_cost)
            self._graphs[device] = runner
            self.stats.cuda_graphs = runner.stats
        return runner

    @property
    def draws_seeds(self) -> bool:
        """Whether a call draws RNG seeds (`seed` does nothing otherwise: a replay skips it)."""
        return bool(self._seed_nodes)

    def seed(self) -> None:
        """This call's RNG seeds, drawn in graph order as the reference executor does, written
        into the device's seed tensor (on CUDA, outside any captured graph)."""
        mem = self._mem
        assert mem is not None
        self._drawn = {n.name: interp.run_node(n, []) for n in self._seed_nodes}
        if self.program.seeds:
            values = [int(self._drawn[s]) for s in self.program.seeds]
            mem.seeds.copy_(torch.tensor(values, dtype=torch.int64))

    def output_buffers(self) -> dict[str, torch.Tensor]:
        mem = self._mem
        assert mem is not None
        return {
            v: torch.empty(b.type.shape, dtype=b.type.dtype.torch, device=mem.device)
            for v, b in self.program.buffers.items()
            if b.kind is BufKind.OUTPUT
        }

    def launch(self, inputs: Sequence[torch.Tensor], outputs: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
        """Every step of the program on `inputs` with this call's seeds already written, into
        `outputs` (the output buffers: taken from the pool or allocated when None)."""
        mem = self._mem
        assert mem is not None
        if mem.lean is not None:
            if outputs is None and self._static:  # uncaptured calls overwrite one buffer per output
                outputs = self._static_buffers(mem)
            return mem.lean(inputs, outputs)
        env: dict[str, Any] = dict(mem.constants)
        env.update(self._drawn)
        for n in self.graph.inputs:
            t = inputs[n.attrs["index"]]
            # Kernels index row-major; an input only torch reads keeps its layout (a channels-last
            # image stays channels-last for cuDNN instead of being transposed for it).
            # NHWC conv templates read theirs channels-last (`TritonProgram.channels_last`).
            env[n.name] = t.contiguous(memory_format=self._format(n.name)) if n.name in self._kernel_reads else t
        if outputs is None:
            self._outputs(env, mem)
        else:
            env.update(outputs)
        for step in self.program.steps:
            if isinstance(step, Segment):
                self._run_segment(step, env)
            else:
                self._run_torch(step, env)
        return [self._result(o, env) for o in self.graph.outputs]

    def _outputs(self, env: dict[str, Any], mem: _Memory) -> None:
        for v, b in self.program.buffers.items():
            if b.kind is not BufKind.OUTPUT:
                continue
            shape, dtype = b.type.shape, b.type.dtype.torch
            if mem.device.type == "cpu":
                env[v] = self._pool.get(v, shape, dtype, static=self._static)
            elif self._static:  # uncaptured CUDA calls: one buffer per output, overwritten per call
                env[v] = self._static_buffers(mem)[v]
            else:  # torch's caching allocator (the capture's private pool while capturing)
                env[v] = torch.empty(shape, dtype=dtype, device=mem.device)

    def _static_buffers(self, mem: _Memory) -> dict[str, torch.Tensor]:
        if not mem.static:
            for v, b in self.program.buffers.items():
                if b.kind is BufKind.OUTPUT:
                    mem.static[v] = torch.empty(b.type.shape, dtype=b.type.dtype.torch, device=mem.device)
        return {v: t.data for v, t in mem.static.items()}

    def _run_segment(self, seg: Segment, env: dict[str, Any]) -> None:
        mem = self._mem
        assert mem is not None
        for ln in mem.rendered.segments[seg.name]:
            self._launch(ln, env, mem)
        if mem.rendered.faults and int(mem.faults.min()) != NO_FAULT:
            raise self._fault(env)

    def _launch(self, ln: Launch, env: dict[str, Any], mem: _Memory) -> None:
        self._launcher(ln, mem)([self._arg(v, env) for v in ln.args])

    def _launcher(self, ln: Launch, mem: _Memory) -> Callable[[Sequence[torch.Tensor]], None]:
        """The callable that launches `ln` on `mem`'s device with its arguments."""
        run = mem.launchers.get(id(ln))
        if run is not None:
            return run
        fn = getattr(mem.module, ln.fn)
        if mem.device.type == "cpu":

            def run(args: Sequence[torch.Tensor]) -> None:
                # The interpreter computes with numpy, which warns where IEEE arithmetic gives
                # inf / NaN (masked lanes, log(0), ...) and eager torch does not.
                with np.errstate(all="ignore"):
                    fn[(ln.grid,)](*args, num_warps=ln.warps)

        else:
            run = LeanLaunch(fn, ln.grid, ln.warps, _stream(mem.device), ln.stages)
        mem.launchers[id(ln)] = run
        return run

    def _run_torch(self, step: TorchStep, env: dict[str, Any]) -> None:
        super()._run_torch(step, env)
        mem = self._mem
        if mem is not None and mem.device.type != "cpu":
            # The reference executor makes sources (full, iota) on the host: kernels read the device.
            for n in step.nodes:
                v = env.get(n)
                if isinstance(v, torch.Tensor) and v.device != mem.device:
                    env[n] = v.to(mem.device)

    def _arg(self, value: str, env: dict[str, Any]) -> torch.Tensor:
        mem = self._mem
        assert mem is not None
        if value == SEEDS:
            return mem.seeds
        if value == FAULTS:
            return mem.faults
        return self._get(value, env)

    def _fault(self, env: dict[str, Any]) -> Exception:
        """The exception of the first fault site that fired (launch order), as eager raises it."""
        mem = self._mem
        assert mem is not None
        slots = mem.faults.tolist()
        mem.faults.fill_(NO_FAULT)
        site = next(s for s in mem.rendered.faults if slots[s.slot] != NO_FAULT)
        node = self.graph[site.node]
        if site.kind is FaultKind.ZERO_DIVISION:
            return interp.located(node, integer_division_by_zero())
        value = int(self._arg(site.buf, env).reshape(-1)[slots[site.slot]])
        return interp.located(node, index_out_of_bounds(value, node.attrs.get("dim", 0), site.rows))

    def _get(self, value: str, env: dict[str, Any]) -> Any:
        mem = self._mem
        assert mem is not None
        return env[value] if value in env else mem.views[value]


def _fixed(mem: _Memory, value: str) -> torch.Tensor:
    """A kernel argument whose tensor is the same on every call of `mem`'s device."""
    if value == SEEDS:
        return mem.seeds
    if value == FAULTS:
        return mem.faults
    return mem.constants[value] if value in mem.constants else mem.views[value]


def _stream(device: torch.device) -> Callable[[], int]:
    """The raw handle of `device`'s current stream (the capture stream while capturing)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = torch._C._cuda_getCurrentRawStream
    return lambda: raw(index)


def replay_cost(plan: FusionPlan, program: Program, kernels: int) -> ReplayCost:
    """The cost model's figures for one call of `program` (`runtime.cudagraphs.ReplayCost`): its
    launches, the plan's predicted time, and the GPU preset's launch time and bandwidth (h100's
    when the plan's target is not a GPU)."""
    target = PRESETS.get(plan.target, PRESETS["h100"])
    steps = sum(isinstance(s, TorchStep) for s in program.steps)
    device_s = sum(g.cost.time_s for g in plan.groups)
    return ReplayCost(kernels + steps, device_s, target.launch_s, target.dram_bw)


def _sm(device: torch.device) -> int:
    """The compute capability of a CUDA device as Triton's targets spell it (90: sm_90); 90
    elsewhere (tests)."""
    if device.type != "cuda":
        return 90
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor
