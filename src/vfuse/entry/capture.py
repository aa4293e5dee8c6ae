"""Capture: how PyTorch programs reach vfuse.

- `torch.compile(m, backend="vfuse")`: Dynamo hands us a torch-level FX graph; AOTAutograd
  (with our decompositions) turns it into ATen forward/backward graphs, each compiled by
  `VfuseBackend.compile_aten`. Graphs with symbolic sizes are specialized per concrete input
  shapes at call time. Any internal failure warns and runs that graph eagerly unless strict.
- `vfuse.compile(fn, example_inputs)`: ahead of time through torch.export (see `aot.py`).
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import TensorifyScalarRestartAnalysis
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily

# The pipeline is imported with the backend (at torch.compile time), not inside the first
# compile: a user's first call then waits for compilation only.
from vfuse.codegen.cpp.toolchain import prepare
from vfuse.compiler import compile_fx, from_static_program, from_symbolic_program, target_of
from vfuse.context import Context, Options
from vfuse.entry import dropout, observe, restart, warm
from vfuse.entry.attention_rewrite import AttentionDecision, rewrite_attention
from vfuse.entry.devices import devices_for, foreign_device
from vfuse.entry.direct import may_skip_wrappers, unboxed, wrappers_are_identity
from vfuse.entry.dumps import graph_context
from vfuse.entry.dynamic import Dynamic
from vfuse.entry.mutations import Lifted, Mutating, lift, overlapping
from vfuse.entry.outputs import all_computed, check_donated, donated_inputs, with_none_outputs, without_none_outputs
from vfuse.entry.remat import RematPlan, partition
from vfuse.entry.specialize import FixedGraphs
from vfuse.entry.trace import trace_aten
from vfuse.entry.warm_program import ProgramCache, plain_outputs
from vfuse.errors import VfuseCodegenError, VfuseCompileError, VfuseOptionError
from vfuse.frontend.decompositions import decomposition_table
from vfuse.frontend.symbols import placeholder_values, sym_env
from vfuse.ir.sym import SymEnv
from vfuse.runtime.arenas import ArenaLender
from vfuse.runtime.compiled import CompiledGraph
from vfuse.runtime.symbolic import SymbolicExecutor
from vfuse.targets import Target, get_target


def _is_symbolic(x: Any) -> bool:
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape)


def describe_failure(e: BaseException) -> str:
    """One line naming what failed; frontend errors already name the FX node and op."""
    return f"{type(e).__name__}: {e}".splitlines()[0]


class VfuseBackend:
    """A Dynamo backend with its own options; `.compiled` keeps every CompiledGraph it built."""

    def __init__(self, **options: Any) -> None:
        self.options = Options.from_env(**options)
        self.compiled: list[CompiledGraph] = []
        self.eager_fallbacks: list[str] = []
        self.fixed = FixedGraphs()  # what a graph with symbolic sizes may reuse
        self.reused = 0  # graphs with symbolic sizes that reused one of those instead of compiling
        self.remat: list[RematPlan] = []  # per training graph: what its backward keeps or recomputes (entry/remat.py)
        self.attention: list[AttentionDecision] = []  # written-out training attention: SDPA or not, and why
        self._ids = itertools.count()
        self.arenas = ArenaLender()  # one arena lent to its graphs in turn (runtime/arenas.py)
        # ATen graphs AOTAutograd traced in earlier processes (entry/warm.py)
        self.graph_cache = warm.GraphCache(self.options.cache_dir) if warm.enabled() else None
        # and what we compiled them to over their symbols (entry/warm_program.py)
        self.programs = ProgramCache(self.graph_cache) if self.graph_cache is not None else None
        self._prepare()  # torch.compile time: the prelude's header is built while Dynamo traces

    def _prepare(self) -> None:
        """Have the precompiled prelude checked or built in the background (`toolchain.prepare`;
        once per process and directory). Started when the backend is made, the header's ~1 s of
        g++ overlaps Dynamo's tracing instead of AOTAutograd's: a cold compile's units no longer
        wait for it (docs/perf-log.md, 2026-12-01 H3)."""
        if self.options.backend in ("cpp", "auto"):
            prepare(self.options.cache_dir, self.options.isa)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        self._prepare()  # a no-op when __init__ started it (a backend per graph: backend="vfuse")
        frozen = _parameter_inputs(gm, example_inputs) if self.options.freeze and not torch.is_grad_enabled() else {}
        attention = None  # before AOTAutograd, which would save the N x N probabilities:
        if _needs_grad(gm, example_inputs):
            attention = rewrite_attention(gm, example_inputs, self._target, self.attention.append)
        key = self._warm_key(gm, example_inputs, frozen)
        hit = None
        if key is not None:
            ready = functools.partial(self._stored_program, key)
            hit = self.graph_cache.load(key, gm, example_inputs, ready)  # type: ignore[union-attr]
        if hit is not None:  # what AOTAutograd traced in an earlier process, as it returned it
            graph, values, first = hit
            return unboxed(self.compile_aten(graph, values, kind="inference", warm_key=key, first=first))
        forward = functools.partial(self.compile_aten, frozen=frozen, kind="forward")
        # the inference forward, when AOTAutograd's wrappers add nothing, and its ATen graph's bytes
        direct: list[tuple[Callable, bytes | None]] = []
        inference = functools.partial(self.compile_aten, frozen=frozen, kind="inference", warm_key=key)
        if may_skip_wrappers(gm, example_inputs):
            inference = functools.partial(
                self._compile_inference, inference, len(example_inputs), direct, key is not None
            )
        compiler = aot_autograd(
            fw_compiler=forward,
            bw_compiler=functools.partial(self.compile_aten, kind="backward"),
            inference_compiler=inference,
            partition_fn=functools.partial(partition, target=self._target, record=self.remat.append),
            decompositions=_decompositions(example_inputs),
            # Inference graphs keep their input updates (entry/mutations.py), written in place;
            # graphs with symbolic sizes leave them to AOTAutograd (their path lowers no copy_).
            keep_inference_input_mutations=not _needs_grad(gm, example_inputs)
            and not any(_is_symbolic(x) for x in example_inputs),
        )
        wrapped = self._traced(compiler, gm, example_inputs, key)
        wrapped = attention.guard(wrapped) if attention is not None else wrapped
        if not direct:
            return wrapped
        fn, graph = direct[0]
        if key is not None and graph is not None:
            self.graph_cache.save(key, graph, gm)  # type: ignore[union-attr]
        return unboxed(fn)

    def _traced(
        self, compiler: Callable, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], key: str | None
    ) -> Callable:
        """AOTAutograd's trace and our compile; a restart of Dynamo's analysis it asks for is
        asked for before the trace where it is certain (entry/restart.py) and remembered under
        `key` (entry/warm.py)."""
        before = warm.specialized_floats() if key is not None else set()
        try:
            restart.specialize_now(gm, example_inputs)
            return compiler(gm, example_inputs)
        except TensorifyScalarRestartAnalysis:
            if key is not None:
                self.graph_cache.save_restart(key, sorted(warm.specialized_floats() - before))  # type: ignore[union-attr]
            raise

    def _warm_key(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], frozen: dict) -> str | None:
        """The graph cache's key for this Dynamo graph (entry/warm.py), or None where it is off or
        does not apply: graphs AOTAutograd's wrappers may change, frozen parameters."""
        if self.graph_cache is None or frozen or not may_skip_wrappers(gm, example_inputs):
            return None
        mutations = not any(_is_symbolic(x) for x in example_inputs)  # as keep_inference_input_mutations
        return warm.cache_key(gm, example_inputs, repr((self.options, mutations)))

    def _target(self) -> Target:
        return get_target(self.options.target, self.options.cache_dir, isa=self.options.isa)

    @staticmethod
    def _compile_inference(
        forward: Callable,
        dynamo_inputs: int,
        direct: list[tuple[Callable, bytes | None]],
        keep: bool,
        gm: torch.fx.GraphModule,
        example_inputs: Any,
    ) -> Callable:
        """AOTAutograd's inference compiler: compiles as usual and, where its runtime wrappers
        would pass everything through unchanged, keeps the result to hand to Dynamo directly
        (and, with `keep`, the graph as traced, for the graph cache)."""
        graph = warm.snapshot(gm) if keep else None  # before compiling, which may rewrite it
        fn = forward(gm, example_inputs)
        if wrappers_are_identity(len(example_inputs), dynamo_inputs):  # symbolic sizes too: ~5 us a call
            direct.append((fn, graph))
        return fn

    def compile_aten(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        frozen: dict[int, torch.Tensor] | None = None,
        kind: str = "forward",
        warm_key: str | None = None,
        first: CompiledGraph | None = None,
    ) -> Callable:
        """AOTAutograd's compiler hook: returns a boxed callable (it takes a list and clears it).
        `warm_key`: the graph cache's key of this inference graph, under which its program over
        its symbols is kept; `first`: that program, loaded (entry/warm_program.py)."""
        if any(_is_symbolic(x) for x in example_inputs):
            # Boxed itself (`Dynamic._boxed_call`): no wrapper frame per call.
            # A program is kept only where Dynamic takes the outputs as they are (no sizes or views).
            keep = warm_key if warm_key is not None and plain_outputs(gm) else None
            compile_variant = functools.partial(self.compile_symbolic, kind=kind, key=keep)
            meta = functools.partial(warm.ensure_meta, gm)
            stored = functools.partial(self._stored_variant, keep) if keep is not None else None
            per_shape = lambda: _Specializing(self, gm)  # noqa: E731
            return Dynamic(compile_variant, per_shape, gm, first=first, meta=meta, stored=stored)
        frozen = frozen or {}
        if not all(i < len(example_inputs) and example_inputs[i].shape == t.shape for i, t in frozen.items()):
            frozen = {}  # AOTAutograd reordered inputs: compile without freezing rather than guess
        if first is not None:  # a fixed-shape program kept by an earlier process (entry/warm_program.py)
            fn = self._adopt(first)
        else:
            keep = warm_key if warm_key is not None and not frozen and plain_outputs(gm) else None
            fn = self.compile_static(gm, frozen, kind, example_inputs, key=keep)
        program = getattr(getattr(getattr(fn, "compiled", None), "executor", None), "program", None)
        if program is None or not program.donated:
            self.fixed.add(gm, example_inputs, fn, frozen, self.options)  # not one that reuses its inputs
        return fn

    def compile_static(
        self,
        gm: torch.fx.GraphModule,
        frozen: dict[int, torch.Tensor] | None = None,
        kind: str = "forward",
        example_inputs: Sequence[Any] = (),
        key: str | None = None,
    ) -> Callable:
        """Compile one graph of fixed shapes; returns a boxed callable (it takes one list). With
        `key` (its graph cache key), a native program that updates no input is kept for later processes."""
        frozen = frozen or {}
        ctx = graph_context(self.options, f"graph{next(self._ids)}", kind, example_inputs)
        try:
            foreign = foreign_device(gm, frozen, devices_for(self.options.backend))
            if foreign is not None:  # no CPU bytes behind it for a kernel to read or write
                raise VfuseCompileError(f"vfuse compiles CPU graphs only: {foreign}")
            tensor_gm, present = without_none_outputs(gm)
            tensor_gm, lifted = lift(tensor_gm)
            # AOTAutograd calls us under its fake mode; our passes evaluate real constants.
            with unset_fake_temporarily():
                donated = donated_inputs() if kind == "backward" and not frozen else ()
                replaces = _replaces(lifted, frozen, example_inputs)
                compiled = compile_fx(tensor_gm, ctx, frozen, replaces=replaces, donated=donated)
        except VfuseCodegenError:
            raise  # a vfuse bug the caller asked to see (raise_codegen_errors)
        except Exception as e:
            if self.options.strict:
                raise VfuseCompileError(f"vfuse could not compile {ctx.graph_id}: {describe_failure(e)}") from e
            warnings.warn(
                f"vfuse: compiling {ctx.graph_id} failed, running it eagerly: {describe_failure(e)}",
                stacklevel=2,
            )
            self.eager_fallbacks.append(describe_failure(e))
            observe.ran_eagerly()
            return make_boxed_func(gm.forward)
        if kind == "forward":  # the saved tensors the backward may reuse (schedule/donate.py)
            check_donated(compiled, present, lifted is not None or bool(frozen))
        mutated = _mutated_inputs(len(example_inputs)) if kind == "forward" else None
        if mutated is not None and not _copies(tensor_gm):  # training: saved inputs are not copied,
            compiled.return_inputs_as_is(mutated)  # but those AOTAutograd updates after the call
        if key is not None and self.programs is not None and lifted is None and not frozen:
            self.programs.save_static(key, compiled, repr(target_of(ctx)))  # no input updated in place
        share = getattr(compiled.executor, "share_arenas", None)
        if share is not None:  # its graphs run one after the other (runtime/arenas.py)
            share(self.arenas)
        self.compiled.append(compiled)
        observe.compiled(compiled, ctx, kind)
        return _calling_convention(compiled, frozen, present, lifted)

    def _adopt(self, compiled: CompiledGraph) -> Callable:
        """The boxed callable of a loaded fixed-shape program, as `compile_static` makes it."""
        share = getattr(compiled.executor, "share_arenas", None)
        if share is not None:
            share(self.arenas)
        return _calling_convention(compiled, {}, ())  # outputs all computed (`plain_outputs`)

    def compile_symbolic(self, gm: torch.fx.GraphModule, env: Any, kind: str, key: str | None = None) -> CompiledGraph:
        """Compile a graph over its symbolic sizes (entry/dynamic.py); raises where it cannot.
        With `key` (its graph cache key), the program is kept for later processes."""
        ctx = graph_context(self.options, f"graph{next(self._ids)}", kind, ())
        foreign = foreign_device(gm, {}, devices_for(self.options.backend))
        if foreign is not None:
            raise VfuseCompileError(f"vfuse compiles CPU graphs only: {foreign}")
        with unset_fake_temporarily():
            compiled = compile_fx(gm, ctx, symbols=env)
        self.compiled.append(compiled)
        observe.compiled(compiled, ctx, f"{kind} (dynamic)")
        executor = compiled.executor
        if key is not None and self.programs is not None and isinstance(executor, SymbolicExecutor):
            if executor.program is not None and executor.source is not None:
                parts = (compiled.graph, compiled.plan, executor.program, executor.source)
                self.programs.save(key, env, parts, repr(target_of(ctx)))
        return compiled

    def _stored_program(self, key: str, graph: torch.fx.GraphModule) -> CompiledGraph | None:
        """The program an earlier process compiled `graph` (a graph cache hit) to over its
        symbols, hinted at the traced example's sizes; None where none serves them."""
        if self.programs is None or not plain_outputs(graph):
            return None
        try:  # hints: the traced example's sizes (its size inputs are SymInts: int() would guard)
            env = sym_env(graph)
        except Exception:  # a symbol no input gives: compiled per shape, as on a miss
            return None
        if env is None:
            return self._stored_variant(key, SymEnv({}))
        return self._stored_variant(key, env, placeholder_values(graph))

    def _stored_variant(self, key: str, env: Any, inputs: Sequence[Any] | None = None) -> CompiledGraph | None:
        """A program kept under `key` that serves `env`'s hints (`ProgramCache.load`; `inputs`: the
        call's arguments or example values, None for a fixed-shape program); None where none does."""
        if self.programs is None:
            return None
        # the graph's id and serial only for a program found: a miss compiles under the next ones
        loaded = self.programs.load(key, env, repr(target_of(Context(self.options))), inputs)
        if loaded is None:
            return None
        parts, env = loaded
        static = inputs is None
        ctx = graph_context(self.options, f"graph{next(self._ids)}", "inference", ())
        with unset_fake_temporarily():
            if static:
                compiled = from_static_program(*parts, ctx)  # type: ignore[arg-type]
            else:
                compiled = from_symbolic_program(*parts, ctx, env)  # type: ignore[arg-type]
        self.compiled.append(compiled)
        observe.compiled(compiled, ctx, "inference" if static else "inference (dynamic)")
        return compiled

    @property
    def stats(self) -> dict[str, Any]:
        """Totals over every graph compiled so far (fallbacks counted by torch op name)."""
        fallbacks: Counter[str] = Counter()
        for c in self.compiled:
            fallbacks.update(c.stats.fallbacks)
        return {
            "graphs": len(self.compiled),
            "eager_graphs": len(self.eager_fallbacks),
            "reference_graphs": sum(1 for c in self.compiled if c.stats.native_error),
            "kernels": sum(c.stats.kernels for c in self.compiled),
            "reused_graphs": self.reused,
            "fallbacks": fallbacks,
            # bytes the training graphs keep for their backward, per step (entry/remat.py)
            "saved_bytes": sum(plan.saved_bytes for plan in self.remat),
        }


def _decompositions(example_inputs: Sequence[Any]) -> dict[Any, Any]:
    """The ATen decompositions for AOTAutograd (it decomposes CIA ops itself); graphs that need
    gradients also draw dropout masks from a saved seed, for the backward to recompute (entry/dropout.py)."""
    table = decomposition_table(include_cia=False)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        table = {**table, **dropout.DECOMPOSITIONS}
    return table


def _needs_grad(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd traces a training graph (its own test): those keep updates out of the graph."""
    tensors = [*example_inputs, *gm.parameters()]
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors)


def _replaces(lifted: Lifted | None, frozen: dict[int, torch.Tensor], example_inputs: Sequence[Any]) -> dict[int, int]:
    """compile_fx's `replaces`: lifted outputs -> their inputs' positions after freezing; frozen
    inputs, non-contiguous ones and ones overlapping another input in memory are left to the
    copy after the call."""
    if lifted is None:
        return {}
    if not example_inputs:
        return {}
    skip = overlapping(example_inputs, lifted) | {i for i in lifted.inputs if not example_inputs[i].is_contiguous()}
    return {
        o: i - sum(1 for f in frozen if f < i)
        for o, i in lifted.replaces().items()
        if i not in frozen and i not in skip
    }


def _mutated_inputs(n: int) -> tuple[int, ...] | None:
    """Positions of the inputs AOTAutograd updates in place after the forward graph it is
    compiling (BatchNorm's running statistics), or None where its metadata does not say."""
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    info = getattr(meta, "input_info", None)
    if info is None or len(info) != n:
        return None
    return tuple(i for i, x in enumerate(info) if x.mutates_data or x.mutates_metadata or x.mutates_storage_metadata)


def _copies(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph still writes into an input (a copy_ `lift` could not turn into an output)."""
    return any(n.target is torch.ops.aten.copy_.default for n in gm.graph.nodes)


def _calling_convention(
    compiled: CompiledGraph, frozen: dict[int, torch.Tensor], present: tuple[Any, ...], lifted: Lifted | None = None
) -> Callable:
    """The callable AOTAutograd gets, in its boxed convention (one list argument, so AOTAutograd
    adds no unboxing frame): drops frozen parameters, runs without input checks (Dynamo's
    guards have checked every input's shape, dtype and device), and restores the constant outputs
    (backward graphs' Nones, the sizes a specialized forward saves). Built once, binding the
    executor directly in the common case."""
    run = compiled.unchecked_runner
    if frozen:
        keep = [i for i in range(len(frozen) + len(compiled.graph.inputs)) if i not in frozen]
        run = functools.partial(_select, run, keep)
    if lifted is not None:  # input updates: written in place (compiled.in_place) or copied in
        run = Mutating(run, lifted, compiled.in_place)
    if not all_computed(present):
        run = functools.partial(_with_nones, run, present)

    def call(args: list) -> list:
        return run(args)

    call._boxed_call = True  # type: ignore[attr-defined]  # what make_boxed_func marks
    call.compiled = compiled  # type: ignore[attr-defined]  # keeps it in vfuse.compiled_graphs() while Dynamo holds this
    call.run_list = run  # type: ignore[attr-defined]  # for entry/direct.unboxed: no frame of ours in between
    return call


def _select(run: Callable[[list], list], keep: list[int], args: list) -> list:
    return run([args[i] for i in keep])


def _with_nones(run: Callable[[list], list], present: tuple[Any, ...], args: list) -> list:
    return with_none_outputs(run(args), present)


def _parameter_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[int, torch.Tensor]:
    """Graph inputs that Dynamo lifted from module parameters or buffers, by position."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = {}
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name if source is not None else ""
        if isinstance(value, torch.Tensor) and ("._parameters[" in name or "._buffers[" in name):
            found[i] = value
    return found


class _Specializing:
    """Compiles a graph with symbolic sizes once per concrete input signature, at call time."""

    def __init__(self, backend: VfuseBackend, gm: torch.fx.GraphModule) -> None:
        self.backend = backend
        self.gm = gm
        self.cache: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.cache.get(key)
        if fn is None:
            # A shape compiled before the sizes became symbolic is not compiled again.
            fn = self.cache[key] = self._reuse(args) or self._compile(args)
        return fn([a for a in args if isinstance(a, torch.Tensor)])  # boxed: see compile_static

    def _reuse(self, args: Sequence[Any]) -> Callable | None:
        fn = self.backend.fixed.find(self.gm, args, self.backend.options)
        if fn is not None:
            self.backend.reused += 1
            observe.reused()
        return fn

    def _compile(self, args: Sequence[Any]) -> Callable:
        """Trace the graph again with the sizes (the non-tensor arguments) burnt in as constants."""
        where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

        def with_sizes(*tensors: torch.Tensor) -> Any:
            full = list(args)
            for i, t in zip(where, tensors):
                full[i] = t
            return self.gm(*full)

        tensors = [args[i] for i in where]
        return self.backend.compile_static(trace_aten(with_sizes, tensors), kind="specialized", example_inputs=tensors)


# torch.compile's modes are Inductor's. vfuse has no autotuning and no CUDA graphs, so every mode
# compiles the same code (README, "torch.compile modes"); an unknown mode is still an error.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def vfuse_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Callable:
    """The function behind `backend="vfuse"` (registered as a torch_dynamo_backends entry point);
    `torch.compile(..., mode=..., options={...})` arrive here as keywords."""
    backend = VfuseBackend(**backend_options(mode, options))
    backend.fixed = _SHARED_FIXED
    return backend(gm, example_inputs)


def backend_options(mode: str | None, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """torch.compile's `mode` checked and its `options` as vfuse's keyword options (which
    Options.from_env checks: unknown names and bad values raise VfuseOptionError)."""
    if mode is not None and mode not in MODES:
        accepted = ", ".join(repr(m) for m in MODES)
        raise VfuseOptionError(f"torch.compile mode={mode!r} is not accepted by backend='vfuse'; accepted: {accepted}")
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise VfuseOptionError(f"torch.compile options= must be a dict of vfuse option names, got {options!r}")
    return dict(options)


# `backend="vfuse"` makes a backend per graph, so what a later graph with symbolic sizes of the
# same frame may reuse is kept here. Not compiler state: entries are weak (they live as long as
# Dynamo holds their compiled callables) and are reused only for an exact match.
_SHARED_FIXED = FixedGraphs()
