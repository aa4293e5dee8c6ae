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
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily

from vfuse.context import Context, Options
from vfuse.errors import VfuseCompileError
from vfuse.frontend.outputs import with_none_outputs, without_none_outputs
from vfuse.runtime.compiled import CompiledGraph


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
        self._ids = itertools.count()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        from vfuse.frontend.decompositions import decomposition_table

        frozen = _parameter_inputs(gm, example_inputs) if self.options.freeze and not torch.is_grad_enabled() else {}
        compiler = aot_autograd(
            fw_compiler=functools.partial(self.compile_aten, frozen=frozen),
            bw_compiler=self.compile_aten,
            decompositions=decomposition_table(),
        )
        return compiler(gm, example_inputs)

    def compile_aten(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], frozen: dict[int, torch.Tensor] | None = None
    ) -> Callable:
        """AOTAutograd's compiler hook: returns a boxed callable (it takes a list and clears it)."""
        if any(_is_symbolic(x) for x in example_inputs):
            return make_boxed_func(_Specializing(self, gm))
        frozen = frozen or {}
        if not all(i < len(example_inputs) and example_inputs[i].shape == t.shape for i, t in frozen.items()):
            frozen = {}  # AOTAutograd reordered inputs: compile without freezing rather than guess
        return make_boxed_func(self.compile_static(gm, frozen))

    def compile_static(self, gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor] | None = None) -> Callable:
        frozen = frozen or {}
        ctx = Context(self.options, graph_id=f"graph{next(self._ids)}")
        try:
            from vfuse.compiler import compile_fx

            tensor_gm, present = without_none_outputs(gm)
            # AOTAutograd calls us under its fake mode; our passes evaluate real constants.
            with unset_fake_temporarily():
                compiled = compile_fx(tensor_gm, ctx, frozen)
        except Exception as e:
            if self.options.strict:
                raise VfuseCompileError(f"vfuse could not compile {ctx.graph_id}: {describe_failure(e)}") from e
            warnings.warn(
                f"vfuse: compiling {ctx.graph_id} failed, running it eagerly: {describe_failure(e)}",
                stacklevel=2,
            )
            self.eager_fallbacks.append(describe_failure(e))
            return gm.forward
        self.compiled.append(compiled)
        return _calling_convention(compiled, frozen, present)

    @property
    def stats(self) -> dict[str, Any]:
        """Totals over every graph compiled so far (fallbacks counted by torch op name)."""
        fallbacks: Counter[str] = Counter()
        for c in self.compiled:
            fallbacks.update(c.stats.fallbacks)
        return {
            "graphs": len(self.compiled),
            "eager_graphs": len(self.eager_fallbacks),
            "kernels": sum(c.stats.kernels for c in self.compiled),
            "fallbacks": fallbacks,
        }


def _calling_convention(
    compiled: CompiledGraph, frozen: dict[int, torch.Tensor], present: tuple[bool, ...]
) -> Callable:
    """The callable AOTAutograd gets: drops frozen parameters, runs without input checks
    (Dynamo's guards have checked every input's shape, dtype and device), and restores the
    None outputs of backward graphs. Built once, so the per-call path stays short."""
    run = compiled.run_unchecked
    if frozen:
        keep = [i for i in range(len(frozen) + len(compiled.graph.inputs)) if i not in frozen]

        def call(*args: Any) -> list:
            return run([args[i] for i in keep])
    else:

        def call(*args: Any) -> list:
            return run(args)

    if all(present):
        return call
    return lambda *args: with_none_outputs(call(*args), present)


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
            fn = self.cache[key] = self._compile(args)
        return fn(*[a for a in args if isinstance(a, torch.Tensor)])

    def _compile(self, args: Sequence[Any]) -> Callable:
        """Trace the graph again with the sizes (the non-tensor arguments) burnt in as constants."""
        from vfuse.compiler import trace_aten

        where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

        def with_sizes(*tensors: torch.Tensor) -> Any:
            full = list(args)
            for i, t in zip(where, tensors):
                full[i] = t
            return self.gm(*full)

        return self.backend.compile_static(trace_aten(with_sizes, [args[i] for i in where]))


def vfuse_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The function behind `backend="vfuse"` (registered as a torch_dynamo_backends entry point)."""
    return VfuseBackend()(gm, example_inputs)
