"""`vfuse.compile(fn, example_inputs)`: ahead-of-time compilation through torch.export.

Export gives one functional ATen graph with parameters and buffers lifted to inputs and every
in-place update turned into an extra output. We bind the lifted inputs to the module's live
tensors at call time (so later weight updates are seen), copy the updates back into the
user's inputs, parameters and buffers after each call (as the graph signature lists them),
and rebuild the user's output structure. A call that needs gradients (grad mode on and an
input or parameter that requires grad) runs the same graph through AOTAutograd, vfuse
compiling its forward and backward, so a loss that mixes our outputs backpropagates correctly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from vfuse.codegen.cpp.toolchain import prepare
from vfuse.compiler import compile_fx, lower_fx, optimize
from vfuse.context import Context, Options
from vfuse.entry import observe
from vfuse.entry.devices import devices_for, foreign_device
from vfuse.entry.dumps import graph_context
from vfuse.errors import VfuseCompileError, VfuseInputError
from vfuse.frontend.symbols import sym_env
from vfuse.ir import Graph
from vfuse.runtime.compiled import CompiledGraph
from vfuse.runtime.symbolic import SymbolicExecutor

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # pytree leaves: such arguments need no flattening
_STATE_UPDATES = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)


class _AsModule(torch.nn.Module):
    """torch.export takes modules; wrap a plain function."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def export(fn: Callable, example_inputs: Sequence[Any], dynamic_shapes: Any = None) -> ExportedProgram:
    from vfuse.frontend.decompositions import decomposition_table

    module = fn if isinstance(fn, torch.nn.Module) else _AsModule(fn)
    examples = _unaliased(module, example_inputs)
    if dynamic_shapes is not None and not isinstance(fn, torch.nn.Module):
        # By the function's argument names or positions: _AsModule's forward takes them as *args.
        given = dynamic_shapes.values() if isinstance(dynamic_shapes, dict) else dynamic_shapes
        dynamic_shapes = (tuple(given),)
    with warnings.catch_warnings():
        # torch.export's own pytree deprecation notice, not actionable by our users.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec")
        exported = torch.export.export(module, examples, dynamic_shapes=dynamic_shapes)
        return exported.run_decompositions(decomposition_table())


def _unaliased(module: torch.nn.Module, example_inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The examples with each tensor that shares memory with an earlier one (or with a
    parameter or buffer) copied: export would otherwise compile `f(t, t)` as reading one input
    twice, and a later call `f(a, b)` would ignore `a`."""
    seen = {_address(t) for t in (*module.parameters(), *module.buffers())}

    def fresh(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if _address(x) in seen:
                with torch.no_grad():
                    x = x.clone()
            seen.add(_address(x))
        return x

    return tuple(pytree.tree_map(fresh, list(example_inputs)))


def _address(t: torch.Tensor) -> int:
    """Where a tensor's memory lives; the object itself for tensors without any (meta, empty,
    sparse)."""
    try:
        return t.untyped_storage().data_ptr() or id(t)
    except (RuntimeError, NotImplementedError):  # layouts without one storage
        return id(t)


class AotCompiled:
    """The callable returned by vfuse.compile: same outputs (and structure) as the original,
    and the same in-place updates of its inputs, parameters and buffers."""

    def __init__(
        self,
        program: ExportedProgram,
        compiled: CompiledGraph,
        frozen: frozenset[int] = frozenset(),
        options: dict[str, Any] | None = None,
    ) -> None:
        self.program = program
        self.compiled = compiled
        self.variants: list[CompiledGraph] = []  # more programs over symbolic sizes (`_variant`)
        self._frozen = frozen
        self._frozen_values = {i: t for i, t in enumerate(_lifted_all(program)) if i in frozen and t is not None}
        self.autograd_backend: Any = None  # the VfuseBackend of calls that need gradients
        self._options = dict(options or {})
        self._autograd: Callable | None = None
        sig = program.graph_signature
        # Lifted parameters, buffers and constants by input position (None: a user input).
        self._all_lifted = [_lifted_tensor(program, spec) for spec in sig.input_specs]
        # Frozen parameters are compiled in as constants and no longer passed.
        specs = [spec for i, spec in enumerate(sig.input_specs) if i not in frozen]
        self._lifted = [t for i, t in enumerate(self._all_lifted) if i not in frozen]
        self._state = [t for t in self._all_lifted if t is not None]
        users = [spec.arg.name for spec in sig.input_specs if spec.kind == InputKind.USER_INPUT]
        outs = sig.output_specs
        updated = [(i, s) for i, s in enumerate(outs) if s.kind in _STATE_UPDATES]
        self._state_updates = [(i, _state_tensor(program, s.target)) for i, s in updated]
        self._state_labels = [f"{s.kind.name.split('_')[0].lower()} '{s.target}'" for _, s in updated]
        self._input_updates = [
            (i, users.index(s.target)) for i, s in enumerate(outs) if s.kind == OutputKind.USER_INPUT_MUTATION
        ]
        self._user_out = [i for i, spec in enumerate(outs) if spec.kind == OutputKind.USER_OUTPUT]
        # Read once: each read of `program.call_spec` builds a new class (half a millisecond).
        self._in_spec = program.call_spec.in_spec
        self._out_spec = program.call_spec.out_spec
        self._single_out = self._out_spec.is_leaf()
        self._plain_in = self._in_spec == pytree.tree_structure((tuple(users), {}))
        self._users = len(users)
        self._updates = bool(self._state_updates or self._input_updates)
        # Plain tensor arguments and nothing lifted: the graph's guard on the call's own argument
        # tuple is the whole entry check (a tensor is a pytree leaf, so it also proves the structure).
        self._direct = self._plain_in and len(self._lifted) == self._users
        self._symbolic = isinstance(compiled.executor, SymbolicExecutor)
        compiled.input_labels = _labels(specs)

    @property
    def graph(self) -> Any:
        return self.compiled.graph

    @property
    def stats(self) -> Any:
        return self.compiled.stats

    def __call__(self, *args: Any) -> Any:
        key = self.compiled.guard(args) if self._direct else None
        if key is not None:
            flat = inputs = args
        else:
            flat = self._flatten(args)
            inputs = flat if len(self._lifted) == self._users else _bind(flat, self._lifted)
            key = self.compiled.check_inputs(inputs)
        if self._updates:
            self._check_unaliased(flat)
        if torch.is_grad_enabled() and self._needs_grad(flat):
            outs = self._run_autograd(flat)
        else:
            compiled = self._variant(inputs, key)
            outs = compiled.run_checked(key, inputs) if compiled is self.compiled else compiled.run_unchecked(inputs)
        if self._updates:
            self._apply_updates(outs, flat)
        if self._single_out:
            return outs[self._user_out[0]]
        return pytree.tree_unflatten([outs[i] for i in self._user_out], self._out_spec)

    def _variant(self, inputs: Sequence[Any], key: tuple[Any, ...]) -> CompiledGraph:
        """The compiled graph for these sizes: with symbolic sizes (export's `Dim`s), a program
        whose guards admit them, compiled now if none does (entry/dynamic.py's policy). `key`:
        the sizes `check_inputs` read, where it read them (else `()`)."""
        if not self._symbolic:
            return self.compiled
        ex = self.compiled.executor
        if ex.serves(key or ex.values(inputs)):
            return self.compiled
        for other in self.variants:
            if other.executor.serves(other.executor.values(inputs)):
                return other
        ctx = graph_context(Options.from_env(**self._options), f"aot{len(self.variants) + 1}", "aot", inputs)
        gm = self.program.graph_module
        other = compile_fx(gm, ctx, self._frozen_values, symbols=sym_env(gm, _with_frozen(inputs, self._frozen)))
        observe.compiled(other, ctx, "aot (dynamic)")
        other.input_labels = self.compiled.input_labels
        self.variants.append(other)
        return other

    def profile(self, *args: Any, reps: int = 20, threads: int | None = None) -> list[Any]:
        """Per-kernel predicted and measured times on these inputs (`CompiledGraph.profile`)."""
        flat = self._flatten(args)
        inputs = flat if len(self._lifted) == self._users else _bind(flat, self._lifted)
        return self.compiled.profile(*inputs, reps=reps, threads=threads)

    def _flatten(self, args: tuple[Any, ...]) -> Sequence[Any]:
        if self._plain_in and len(args) == self._users and all(type(a) in _PLAIN for a in args):
            return args
        flat, spec = pytree.tree_flatten((args, {}))
        if spec != self._in_spec:
            raise VfuseInputError(f"inputs have structure {spec}, but the function was compiled for {self._in_spec}")
        return flat

    def _needs_grad(self, flat: Sequence[Any]) -> bool:
        # Loops, not any() over a tuple of both: asked on every call in grad mode.
        for t in flat:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return True
        for t in self._state:
            if t.requires_grad:
                return True
        return False

    def _run_autograd(self, flat: Sequence[Any]) -> list[Any]:
        """Forward through AOTAutograd (built on first use): outputs carry the graph's autograd
        history, and backward runs a compiled backward graph."""
        inputs = _bind(flat, self._all_lifted)
        if self._autograd is None:
            from vfuse.entry.capture import VfuseBackend

            gm = self.program.graph_module
            self.autograd_backend = VfuseBackend(**{**self._options, "freeze": False})
            self._autograd = self.autograd_backend(torch.fx.GraphModule(gm, gm.graph), inputs)
        return list(self._autograd(*inputs))

    def _apply_updates(self, outs: Sequence[Any], flat: Sequence[Any]) -> None:
        """What the original did in place: buffers and parameters without autograd (as
        BatchNorm updates its running stats), user inputs as `copy_` does in eager."""
        with torch.no_grad():
            for i, target in self._state_updates:
                target.copy_(outs[i])
        for i, k in self._input_updates:
            flat[k].copy_(outs[i])

    def _check_unaliased(self, flat: Sequence[Any]) -> None:
        """The graph reads every input before any update: right only if no updated input or
        updated buffer shares memory with another input."""
        addrs = {k: _address(t) for k, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        state = [(_address(t), label) for (_, t), label in zip(self._state_updates, self._state_labels)]
        clashes = [(k, label) for addr, label in state for k, a in addrs.items() if a == addr]
        clashes += [
            (k, f"input {j}") for _, k in self._input_updates for j, a in addrs.items() if j != k and a == addrs[k]
        ]
        if clashes:
            k, other = clashes[0]
            raise VfuseInputError(
                f"input {k} shares memory with {other}, and the compiled function updates one of them in place: "
                "vfuse.compile reads all inputs before any update; pass separate tensors"
            )


def _bind(flat: Sequence[Any], lifted: Sequence[torch.Tensor | None]) -> list[Any]:
    user = iter(flat)
    return [next(user) if t is None else t for t in lifted]


def _labels(specs: Sequence[Any]) -> list[str]:
    """Name inputs as the user knows them: 'input 0 (x)' or "parameter 'lin.weight'"."""
    labels, user = [], 0
    for spec in specs:
        if spec.kind == InputKind.USER_INPUT:
            labels.append(f"input {user} ({spec.arg.name})")
            user += 1
        else:
            labels.append(f"{spec.kind.name.lower()} '{spec.target}'")
    return labels


def _state_tensor(program: ExportedProgram, target: str) -> torch.Tensor:
    """A parameter or buffer by name (non-persistent buffers live among the constants)."""
    return program.state_dict[target] if target in program.state_dict else program.constants[target]


def _lifted_tensor(program: ExportedProgram, spec: Any) -> torch.Tensor | None:
    """The live parameter/buffer/constant behind a lifted input; None for a user input."""
    if spec.kind == InputKind.USER_INPUT:
        return None
    return _state_tensor(program, spec.target)


def compile_aot(fn: Callable, example_inputs: Sequence[Any], dynamic_shapes: Any = None, **options: Any) -> AotCompiled:
    checked = Options.from_env(**options)  # a bad option fails before the export
    if checked.backend in ("cpp", "auto"):  # the precompiled prelude, built during the export
        prepare(checked.cache_dir, checked.isa)
    program = export(fn, example_inputs, dynamic_shapes)
    foreign = foreign_device(program.graph_module, allowed=devices_for(checked.backend))
    if foreign is not None:  # kernels read CPU memory only; torch.compile runs such graphs eagerly
        raise VfuseCompileError(f"vfuse.compile compiles CPU programs only: {foreign}")
    ctx = graph_context(checked, "aot0", "aot", example_inputs)
    frozen = _freezable(program) if ctx.options.freeze else {}
    compiled = compile_fx(program.graph_module, ctx, frozen, symbols=sym_env(program.graph_module))
    observe.compiled(compiled, ctx, "aot")
    return AotCompiled(program, compiled, frozenset(frozen), options)


def _lifted_all(program: ExportedProgram) -> list[torch.Tensor | None]:
    return [_lifted_tensor(program, spec) for spec in program.graph_signature.input_specs]


def _with_frozen(inputs: Sequence[Any], frozen: frozenset[int]) -> list[Any]:
    """The graph's full argument list (frozen positions hold None: their sizes are fixed)."""
    it = iter(inputs)
    return [None if i in frozen else next(it) for i in range(len(inputs) + len(frozen))]


def _freezable(program: ExportedProgram) -> dict[int, torch.Tensor]:
    """Parameters, buffers and constants the graph never mutates, by input position."""
    sig = program.graph_signature
    mutated = {spec.target for spec in sig.output_specs if spec.kind in _STATE_UPDATES}
    return {
        i: tensor
        for i, spec in enumerate(sig.input_specs)
        if (tensor := _lifted_tensor(program, spec)) is not None and spec.target not in mutated
    }


def to_ir(fn: Any, example_inputs: Sequence[Any], ctx: Context) -> Graph:
    """Export `fn` (module or function) on these inputs and return its optimized IR."""
    program = export(fn, example_inputs)
    return optimize(lower_fx(program.graph_module, ctx), ctx)
