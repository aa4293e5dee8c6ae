"""`vfuse.compile(fn, example_inputs)`: ahead-of-time compilation through torch.export.

Export gives one ATen graph with parameters and buffers lifted to inputs; we bind those to
the module's live tensors at call time (so later weight updates are seen), apply buffer
mutations (BatchNorm running stats) after each call, and rebuild the user's output structure.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from vfuse.context import Context, Options
from vfuse.errors import VfuseInputError
from vfuse.runtime.compiled import CompiledGraph


class _AsModule(torch.nn.Module):
    """torch.export takes modules; wrap a plain function."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def export(fn: Callable, example_inputs: Sequence[Any]) -> ExportedProgram:
    from vfuse.frontend.decompositions import decomposition_table

    module = fn if isinstance(fn, torch.nn.Module) else _AsModule(fn)
    with warnings.catch_warnings():
        # torch.export's own pytree deprecation notice, not actionable by our users.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec")
        return torch.export.export(module, tuple(example_inputs)).run_decompositions(decomposition_table())


class AotCompiled:
    """The callable returned by vfuse.compile: same outputs (and structure) as the original."""

    def __init__(self, program: ExportedProgram, compiled: CompiledGraph, frozen: frozenset[int] = frozenset()) -> None:
        self.program = program
        self.compiled = compiled
        sig = program.graph_signature
        # Frozen parameters are compiled in as constants and no longer passed.
        specs = [spec for i, spec in enumerate(sig.input_specs) if i not in frozen]
        self._lifted = [_lifted_tensor(program, spec) for spec in specs]
        self._mutations = [
            (i, spec.target) for i, spec in enumerate(sig.output_specs) if spec.kind == OutputKind.BUFFER_MUTATION
        ]
        self._user_out = [i for i, spec in enumerate(sig.output_specs) if spec.kind == OutputKind.USER_OUTPUT]
        compiled.input_labels = _labels(specs)

    @property
    def graph(self) -> Any:
        return self.compiled.graph

    @property
    def stats(self) -> Any:
        return self.compiled.stats

    def __call__(self, *args: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, {}))
        if spec != self.program.call_spec.in_spec:
            raise VfuseInputError(
                f"inputs have structure {spec}, but the function was compiled for {self.program.call_spec.in_spec}"
            )
        user = iter(flat)
        inputs = [next(user) if t is None else t for t in self._lifted]
        outs = self.compiled(*inputs)
        for i, target in self._mutations:
            self.program.state_dict[target].copy_(outs[i])
        return pytree.tree_unflatten([outs[i] for i in self._user_out], self.program.call_spec.out_spec)


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


def _lifted_tensor(program: ExportedProgram, spec: Any) -> torch.Tensor | None:
    """The live parameter/buffer/constant behind a lifted input; None for a user input."""
    if spec.kind == InputKind.USER_INPUT:
        return None
    if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in program.state_dict:
        return program.state_dict[spec.target]
    return program.constants[spec.target]


def compile_aot(fn: Callable, example_inputs: Sequence[Any], **options: Any) -> AotCompiled:
    from vfuse.compiler import compile_fx

    program = export(fn, example_inputs)
    ctx = Context(Options.from_env(**options), graph_id="aot0")
    frozen = _freezable(program) if ctx.options.freeze else {}
    return AotCompiled(program, compile_fx(program.graph_module, ctx, frozen), frozenset(frozen))


def _freezable(program: ExportedProgram) -> dict[int, torch.Tensor]:
    """Parameters, buffers and constants the graph never mutates, by input position."""
    sig = program.graph_signature
    mutated = {spec.target for spec in sig.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    return {
        i: tensor
        for i, spec in enumerate(sig.input_specs)
        if (tensor := _lifted_tensor(program, spec)) is not None and spec.target not in mutated
    }
