"""NativeExecutor: runs a scheduled Program as generated C++ kernels plus torch steps in between.

The compiler hands it the Program, its C++ source and the loaded library (`compiler.compile_fx`:
schedule, render, build); the executor binds the entry points and allocates the arena. Each
call: draw RNG seeds, bind inputs (made contiguous: kernels index row-major), allocate fresh
outputs (from a pool, see `OutputPool`), then run the steps in order: one native call per
segment (fp32 GEMM / conv / attention run inside it as generated kernels with their epilogue),
torch for OPAQUE nodes, contractions the templates do not cover, and fallbacks. Programs of
native segments only take the lean path of `callplan.py` instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vfuse import interp
from vfuse.codegen.cpp.faults import CODES, FAULT_BYTES, fault_offset
from vfuse.codegen.cpp.gemm.prepack import prepack_layout
from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Op
from vfuse.ir.defs.layout import index_out_of_bounds
from vfuse.ir.defs.pointwise import integer_division_by_zero
from vfuse.runtime.arenas import LEND_MIN_BYTES, ArenaLender
from vfuse.runtime.callplan import CallPlan, make_call_plan
from vfuse.runtime.compiled import ExecStats
from vfuse.runtime.omp_start import start_torch_threads
from vfuse.runtime.pool import OutputPool, donated_views
from vfuse.runtime.steps import StepRunner, drops_after_steps, fallback_counts, torch_nodes
from vfuse.schedule import BufKind, Program, Segment

ARENA_ALIGN = 64


def _entries(program: Program, lib: ctypes.CDLL | None) -> tuple[dict[str, Any], list[Any]]:
    """The entry point of every segment by name, with argtypes (general path), and in program
    order without them, for ctypes-typed arguments (lean path)."""
    entries, raw = {}, []
    for seg in program.segments:
        assert lib is not None, "a program with native segments needs its library"
        fn = getattr(lib, seg.name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        fn.restype = ctypes.c_int  # 0, or the code of a fault (codegen/cpp/faults.py)
        entries[seg.name] = fn
        bare = lib[seg.name]  # a separate function object: indexing does not cache
        bare.restype = ctypes.c_int
        raw.append(bare)
    return entries, raw


def _lean_plan(program: Program, graph: Any) -> CallPlan | None:
    """The lean path's plan, or None: outputs placed in donated inputs or the arena
    (schedule/donate.py) are bound per call by the general path."""
    return None if program.donated or program.arena_outputs else make_call_plan(program, graph)


class NativeExecutor(StepRunner):
    """Callable `(inputs) -> outputs` for one FusionPlan's Program; `.source` is the generated C++,
    `library` the loaded translation unit (None when the program has no native segment)."""

    def __init__(
        self,
        plan: FusionPlan,
        program: Program,
        source: str,
        library: ctypes.CDLL | None,
        static_outputs: bool = False,
        cache_dir: Path | None = None,
        sizes: Sequence[int] = (),
        pool: OutputPool | None = None,
    ) -> None:
        self.plan = plan
        self.sizes = tuple(sizes)  # values of Program.symbols: after the seeds in the seeds array
        self.cache_dir = cache_dir  # where its library was built; the profiler builds its timing build there
        self.graph = plan.graph
        self.program = program
        self.source = source
        self._entries, self._raw_entries = _entries(program, library)
        slots = [b.slot for b in self.program.buffers.values() if b.kind in (BufKind.INPUT, BufKind.OUTPUT)]
        self._ptrs = (ctypes.c_void_p * (max(slots, default=-1) + 1))()
        # Tensors are allocated on the first call: compilation may run under a FakeTensorMode.
        self._arena: torch.Tensor | None = None
        self._arena_off = 0
        self._lender: ArenaLender | None = None  # lends the arena per call instead (share_arenas)
        self._arena_need = 0
        self._ready = False  # seeds, sizes, constants and arena set up (`_allocate`, first call)
        self.lean: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None = None  # set up: the lean path
        self._seeds = torch.zeros(0, dtype=torch.int64)
        self._constants: dict[str, torch.Tensor] | None = None  # contiguous, made on the first call
        self._call_facts(program)
        self._static = static_outputs
        # Per-call work precomputed: which names to bind, draw and allocate.
        self._input_names = [(n.name, n.attrs["index"]) for n in self.graph.inputs]
        self._rng_nodes = [n for n in self.graph.nodes if n.op is Op.RNG_SEED]
        bufs = self.program.buffers
        self._outputs = [(v, b.type.shape, b.type.dtype.torch) for v, b in bufs.items() if b.kind is BufKind.OUTPUT]
        # Only inputs and outputs live in the pointer table; seeds have their own array and
        # intermediates their arena offsets, and their slot numbers mean nothing here.
        pointer_kinds = (BufKind.INPUT, BufKind.OUTPUT)
        self._slots = {
            s.name: [(v, bufs[v].slot) for v in (*s.inputs, *s.outputs) if bufs[v].kind in pointer_kinds]
            for s in self.program.segments
        }
        self._drops = drops_after_steps(self.program, self.graph, self._slots)  # the general path's frees
        self._pool = OutputPool() if pool is None else pool  # shared by a symbolic program's sizes
        self._lock = threading.Lock()
        self._plan: CallPlan | None = _lean_plan(program, self.graph)
        # Arguments of the lean path's foreign calls, as ctypes objects made once: passing
        # them to entries without argtypes skips the per-argument conversion.
        self._arena_arg = ctypes.c_void_p(0)
        self._seeds_arg = ctypes.c_void_p(0)
        self._threads_arg = ctypes.c_int(0)
        self.stats = ExecStats(
            "cpp",
            kernels=len(self.program.kernels),
            native_calls=len(self.program.segments),
            torch_calls=torch_nodes(self.program),
            arena_bytes=self.program.memory.size,
            fallbacks=fallback_counts(self.program, plan),
        )

    def _call_facts(self, program: Program) -> None:
        """What calls read of the Program besides the call plan, kept so that a copy at other
        sizes (`at_sizes`) needs no Program: seed names, constants' pointer slots (no sizes in
        them), where the prepacked operands' region starts and the arena ends."""
        self._seed_names = program.seeds
        consts = [n.name for n in self.graph.nodes if n.op is Op.CONSTANT and n.name in program.buffers]
        self._constant_slots = [(name, program.buffers[name].slot) for name in consts]
        _, self._pack_start, self._arena_end = prepack_layout(program)

    @property
    def call_plan(self) -> CallPlan | None:
        """The lean per-call plan, or None where calls take the general path."""
        return self._plan

    def _allocate(self) -> None:
        # Past the intermediates, the fault record kernels report errors in (faults.py), then the
        # persistent region of B operands packed once (codegen/cpp/gemm/prepack.py): zeroed, as
        # its headers say "not packed yet".
        start, end = self._pack_start, self._arena_end
        if self._arena is None:  # else bound by the caller (`bind_arena`: a symbolic program's shared one)
            self._arena = torch.empty(end + ARENA_ALIGN, dtype=torch.uint8)
            self._arena_off = -self._arena.data_ptr() % ARENA_ALIGN
        if end > start:
            self._arena[self._arena_off + start : self._arena_off + end].zero_()
        self._ready = True
        self._seeds = torch.tensor([0] * len(self._seed_names) + list(self.sizes) or [0], dtype=torch.int64)
        if self._constants is None:
            self._constants = {
                n.name: n.attrs["value"].tensor.contiguous() for n in self.graph.nodes if n.op is Op.CONSTANT
            }
        self._arena_arg.value = self._arena.data_ptr() + self._arena_off
        self._seeds_arg.value = self._seeds.data_ptr()
        if self._plan is not None:
            # Constants never move: the lean path binds them once, here.
            for name, slot in self._constant_slots:
                self._ptrs[slot] = self._constants[name].data_ptr()
            self.lean = functools.partial(self._run_planned, self._plan)

    def arena_bytes(self) -> int:
        """Bytes its arena needs (intermediates, fault record, prepacked operands, alignment)."""
        return self._arena_end + ARENA_ALIGN

    def bind_arena(self, arena: torch.Tensor) -> None:
        """Run on `arena` (at least `arena_bytes()`), shared with the executors of a symbolic
        program's other sizes (runtime/symbolic.py); calls must not overlap: the caller locks."""
        if self._arena is not arena:
            self._arena = arena
            self._arena_off = -arena.data_ptr() % ARENA_ALIGN
            self._arena_arg.value = arena.data_ptr() + self._arena_off

    def call_on(self, arena: torch.Tensor, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A call on `arena` (`bind_arena`) by a caller holding the lock that serializes this
        executor's calls (a symbolic program's runner: its sizes share the arena): no lock of
        its own, one frame less per call."""
        if self._arena is not arena:
            self.bind_arena(arena)
        if self._plan is not None and self._ready:
            return self._run_planned(self._plan, inputs)
        return self._run(inputs)

    def share_arenas(self, lender: ArenaLender) -> bool:
        """Borrow the arena from `lender` for each call instead of keeping one (runtime/arenas.py);
        False where the program keeps its own: prepacked operands persist in it, or it is small."""
        offsets, _, _ = prepack_layout(self.program)
        need = self.arena_bytes()
        if offsets or need < LEND_MIN_BYTES:
            return False
        with self._lock:
            self._lender, self._arena_need = lender, need
            if self._arena is not None and self._arena_off + need <= self._arena.numel():
                lender.give(self._arena)  # the one it had becomes the lender's
        return True

    def at_sizes(
        self,
        sizes: tuple[int, ...],
        program: Callable[[], Program],
        output_shapes: Sequence[tuple[int, ...]],
        layout: tuple[int, int],
    ) -> NativeExecutor:
        """This executor (of a symbolic program at one size, on the lean path) at other values of
        the symbols, made in microseconds (runtime/symbolic.py): entry points, pointer slots,
        constants and output pool shared; only the output shapes, the arena layout
        (`prepack_layout`'s start and end) and the sizes are new. `program()` substitutes the
        sizes into the whole Program, done only when something reads `.program` (a fault's
        report, the profiler)."""
        assert self._plan is not None, "the general path needs the Program at its sizes"
        ex = object.__new__(SizedExecutor)
        ex.__dict__.update((k, v) for k, v in self.__dict__.items() if k != "program")
        ex._program_at = program
        ex.sizes = sizes
        ex._ptrs = type(self._ptrs)()
        ex._arena, ex._arena_off, ex._lender, ex._ready, ex.lean = None, 0, None, False, None
        ex._lock = threading.Lock()
        ex._arena_arg, ex._seeds_arg, ex._threads_arg = ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(0)
        ex._outputs = [(v, shape, dtype) for (v, _, dtype), shape in zip(self._outputs, output_shapes, strict=True)]
        ex._plan = dataclasses.replace(self._plan, outputs=tuple(ex._outputs))
        ex._pack_start, ex._arena_end = layout
        return ex

    def _arena_view(self, value: str) -> torch.Tensor:
        b = self.program.buffers[value]
        start = self._arena_off + b.slot
        assert self._arena is not None
        raw = self._arena[start : start + b.type.nbytes]
        return raw.view(b.type.dtype.torch).view(b.type.shape)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # The arena, pointer table and seed array are shared: one call at a time.
        with self._lock:
            if self._lender is not None:
                return self._run_lent(self._lender, inputs)
            if self._plan is not None and self._ready:
                return self._run_planned(self._plan, inputs)
            return self._run(inputs)

    def _run_lent(self, lender: ArenaLender, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # Kept bound after the call: the next call usually gets the same arena back (no rebind),
        # and a dropped smaller one is released when this executor next binds another.
        arena = lender.take(self._arena_need)
        try:
            self.bind_arena(arena)
            if self._plan is not None and self._ready:
                return self._run_planned(self._plan, inputs)
            return self._run(inputs)
        finally:
            lender.give(arena)

    def _run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not self._ready:
            self._allocate()
        assert self._arena is not None
        if self._plan is not None:
            return self._run_planned(self._plan, inputs)
        env = self._prepare(inputs)
        nt = torch.get_num_threads()
        start_torch_threads(nt)
        arena = self._arena.data_ptr() + self._arena_off
        for step, drops in zip(self.program.steps, self._drops, strict=True):
            if isinstance(step, Segment):
                self._bind(step, env)
                if self._entries[step.name](self._ptrs, arena, self._seeds.data_ptr(), nt):
                    raise self._fault()
            else:
                self._run_torch(step, env)
            for v in drops:
                env.pop(v, None)
        return [self._result(o, env) for o in self.graph.outputs]

    def _prepare(self, inputs: Sequence[torch.Tensor]) -> dict[str, Any]:
        """The general path's environment: constants, inputs, this call's seeds and outputs."""
        if not self._ready:
            self._allocate()
        env: dict[str, Any] = dict(self._constants or {})
        for name, index in self._input_names:
            x = inputs[index]  # AOTAutograd passes None for an effect token (torch.linalg.inv's)
            env[name] = x.contiguous() if isinstance(x, torch.Tensor) else x
        self._draw_seeds(env)
        self._alloc_outputs(env, inputs)
        return env

    def _run_planned(self, plan: CallPlan, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The lean path: bind pointers by precomputed slot, call every segment, return.
        Written flat (no helper calls per tensor): at a few us a call, each frame shows."""
        ptrs = self._ptrs
        held = []  # contiguous copies must live until the kernels return
        for slot, i in plan.inputs:
            t = inputs[i]
            if not t.is_contiguous():
                t = t.contiguous()
                held.append(t)
            ptrs[slot] = t.data_ptr()
        outs = self._planned_outputs(plan)
        if plan.draws_seeds:
            self._draw_seeds({})
        nt = torch.get_num_threads()
        start_torch_threads(nt)
        self._threads_arg.value = nt
        for entry in self._raw_entries:
            if entry(ptrs, self._arena_arg, self._seeds_arg, self._threads_arg):
                raise self._fault()
        if plan.in_order:
            return outs
        return [outs[k] if k >= 0 else _handed_back(inputs[-1 - k]) for k in plan.results]

    def _planned_outputs(self, plan: CallPlan) -> list[torch.Tensor]:
        """This call's outputs on the lean path, each one's data pointer stored in its slot."""
        return self._pool.take(plan.outputs, self._static, self._ptrs, plan.output_slots)

    def _fault(self) -> Exception:
        """The exception eager torch raises for the fault a kernel recorded, naming its node."""
        assert self._arena is not None
        at = self._arena_off + fault_offset(self.program)
        code, name_at, value, bound = self._arena[at : at + FAULT_BYTES].view(torch.int64).tolist()
        node = self.graph[ctypes.string_at(name_at).decode()]
        if CODES.get(code) == "index":
            return interp.located(node, index_out_of_bounds(value, node.attrs.get("dim", 0), bound))
        return interp.located(node, integer_division_by_zero())

    def _draw_seeds(self, env: dict[str, Any]) -> None:
        """One fresh seed per RNG_SEED node, drawn in graph order: the reference executor's draws."""
        for node in self._rng_nodes:
            env[node.name] = interp.run_node(node, [])
        for k, name in enumerate(self._seed_names):
            self._seeds[k] = env[name]

    def _alloc_outputs(self, env: dict[str, Any], inputs: Sequence[Any] = ()) -> None:
        p, donated = self.program, {}
        if p.donated:
            donated = donated_views(p.donated, self._outputs, env, inputs, p.donor_block, p.donor_block_bytes)
        for v, shape, dtype in self._outputs:
            env[v] = donated[v] if v in donated else self._pool.get(v, shape, dtype, static=self._static)

    def _bind(self, seg: Segment, env: dict[str, Any]) -> None:
        ptrs = self._ptrs
        for v, slot in self._slots[seg.name]:
            ptrs[slot] = env[v].data_ptr()

    def _get(self, value: str, env: dict[str, Any]) -> Any:
        if value in env:
            return env[value]
        return self._arena_view(value)


def _handed_back(x: Any) -> Any:
    """A returned graph input as the general path's environment holds it."""
    return x.contiguous() if isinstance(x, torch.Tensor) else x


class SizedExecutor(NativeExecutor):
    """A `NativeExecutor.at_sizes` copy: its Program at its sizes is substituted on first use."""

    _program_at: Callable[[], Program]

    @functools.cached_property
    def program(self) -> Program:  # type: ignore[override]
        return self._program_at()
