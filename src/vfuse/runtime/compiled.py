"""CompiledGraph: the callable vfuse hands back for one graph, and the reference executor.

An executor runs a planned graph on concrete tensors. The reference executor here is always
available; the native one (`vfuse.runtime.native`, generated C++) is used when a compiler works.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from vfuse import interp
from vfuse.errors import VfuseInputError
from vfuse.ir import Graph, Op
from vfuse.ir.sym import is_sym, pretty
from vfuse.runtime.inputguard import Guard, input_guard


@dataclass
class ExecStats:
    """What an executor did; the report and tests read these."""

    backend: str = "interp"
    kernels: int = 0
    native_calls: int = 0
    torch_calls: int = 0
    arena_bytes: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    native_error: str = ""  # why native code could not be built (the graph runs on the reference)
    cuda_graphs: Any = None  # runtime.cudagraphs.GraphStats of a Triton executor's CUDA calls


class Executor(Protocol):
    stats: Any

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]: ...


def fallback_counts(graph: Graph) -> Counter[str]:
    """OPAQUE nodes by torch op name: the ops vfuse ran through torch instead of compiling."""
    return Counter(str(n.attrs["call"]) for n in graph.nodes if n.op is Op.OPAQUE)


class InterpExecutor:
    """Runs the graph op by op with the reference semantics (no fusion, always correct)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        compute = [n for n in graph.compute_nodes if n.op is not Op.GET_ITEM]
        self.stats = ExecStats("interp", torch_calls=len(compute), fallbacks=fallback_counts(graph))

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return interp.run(self.graph, inputs)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {str(x.dtype).removeprefix('torch.')}{list(x.shape)} on {x.device}"
    return type(x).__name__


class CompiledGraph:
    """A compiled IR graph: validates inputs, then runs its executor. Callable with positional tensors."""

    def __init__(self, graph: Graph, plan: Any, executor: Executor, name: str = "graph0") -> None:
        self.graph = graph
        self.plan = plan
        self.executor = executor
        self.name = name
        self._expected = [(n.attrs["index"], n.tensor_type) for n in graph.inputs]
        # What a call compares, in torch's terms (read per call, each costs a frame otherwise).
        self._checks = [(i, t.shape, t.dtype.torch) for i, t in self._expected]
        # Symbolic sizes (ir/sym.py) are checked by the executor, which reads them: here only the
        # fixed ones, with the rank.
        self._symbolic = any(is_sym(d) for _, t in self._expected for d in t.shape)
        self._size_check = getattr(executor, "check", None) if self._symbolic else None
        # Size arguments of a symbolic graph have positions but no INPUT node.
        self._arity = max((i + 1 for i, _ in self._expected), default=0)
        # Executors that run CUDA tensors too (Triton) say so; the others read CPU memory only.
        self._cuda = "cuda" in getattr(executor, "devices", ())
        # The checks below written out as one function (runtime/inputguard.py): a call that
        # passes it is checked; one that fails it runs the loop, which names what is wrong.
        bindings = getattr(executor, "bindings", None) if self._symbolic else ()
        sizes = [(b.name, b.index, b.dim) for b in bindings or ()]
        self._guard: Guard = _never if bindings is None else input_guard(self._checks, self._arity, self._cuda, sizes)
        # A symbolic executor is run at the sizes the guard read (`run_checked`), not read again.
        self._by_key = bool(sizes) and hasattr(executor, "run")
        # How errors name each input; the AOT path relabels lifted parameters and user inputs.
        self.input_labels = [f"input {i}" for i in range(len(self._expected))]
        self.compile_s = 0.0
        # Output positions (of the compiled FX graph) the program writes into their inputs instead
        # of returning them (compiler.compile_fx's `replaces`); the graph returns the others.
        self.in_place: tuple[int, ...] = ()
        # Aliasing is decided at compile time so the common call pays nothing for it: only the
        # reference executor returns views, and a native output can only alias if it *is* an
        # input or is returned twice.
        outs = graph.outputs
        self._may_alias = (
            isinstance(executor, InterpExecutor)
            or len(set(outs)) != len(outs)
            or any(graph[o].op is Op.INPUT for o in outs)
        )
        self._copied: tuple[int, ...] = ()  # outputs copied without `_may_alias` (return_inputs_as_is)
        # Outputs sharing memory by design (a donated input's or the arena they keep: schedule/donate.py)
        program = getattr(executor, "program", None)
        placed = [v for v, *_ in (*getattr(program, "donated", ()), *getattr(program, "arena_outputs", ()))]
        self._placed = frozenset(outs.index(v) for v in placed if v in outs)  # first occurrences

    @property
    def stats(self) -> Any:
        return self.executor.stats

    def return_inputs_as_is(self, except_inputs: Collection[int] = ()) -> None:
        """Let outputs that are graph inputs be the input tensors themselves, as Inductor does, for
        callers that only keep them (AOTAutograd's training forward returns the weights and inputs
        the backward reads): not a copy of each per step. Inputs at `except_inputs` (those the
        caller updates in place after the call) are still copied, as are the reference
        executor's views and an output returned twice."""
        g, outs = self.graph, self.graph.outputs
        if isinstance(self.executor, InterpExecutor) or len(set(outs)) != len(outs):
            return
        self._may_alias = False
        self._copied = tuple(
            k for k, o in enumerate(outs) if g[o].op is Op.INPUT and g[o].attrs["index"] in except_inputs
        )

    @property
    def guard(self) -> Guard:
        """`guard(inputs) -> key | None`: the checks of `check_inputs` as one generated function;
        the key is the symbolic sizes read (`()` without symbols), None where a check fails."""
        return self._guard

    def check_inputs(self, inputs: Sequence[object]) -> tuple[Any, ...]:
        """Raise VfuseInputError naming the first input that differs from what was compiled for;
        return the call's key (`guard`) for `run_checked`."""
        key = self._guard(inputs)
        if key is not None:
            return key
        self._check_each(inputs)
        return tuple(self.executor.values(inputs)) if self._by_key else ()  # type: ignore[attr-defined]

    def _check_each(self, inputs: Sequence[object]) -> None:
        if len(inputs) != self._arity:
            raise VfuseInputError(f"{self.name}: expected {self._arity} inputs, got {len(inputs)}")
        for index, shape, dtype in self._checks:
            got = inputs[index]
            if not (
                isinstance(got, torch.Tensor)
                and (_shape_fits(got.shape, shape) if self._symbolic else got.shape == shape)
                and got.dtype is dtype
                and (got.is_cpu or (self._cuda and got.is_cuda))
            ):
                where = "cpu or cuda" if self._cuda else "cpu"
                sizes = ", ".join(map(pretty, shape))
                raise VfuseInputError(
                    f"{self.name}: {self.input_labels[index]} was compiled for {dtype}[{sizes}] on {where}, "
                    f"received {_describe(got)}"
                )
        if self._size_check is not None:  # dims sharing a symbol agree: kernels read every tensor at the sizes read
            self._size_check(inputs)
        # get_device() is an int (-1 on the CPU): cheaper per call than building torch.device objects
        if self._cuda and inputs and len({t.get_device() for t in inputs}) > 1:  # type: ignore[attr-defined]
            devices = sorted({str(t.device) for t in inputs})  # type: ignore[attr-defined]
            raise VfuseInputError(f"{self.name}: inputs on several devices ({', '.join(devices)})")

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        key = self._guard(inputs)
        return self.run_checked(self.check_inputs(inputs) if key is None else key, inputs)

    def run_checked(self, key: tuple[Any, ...], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run inputs `check_inputs` admitted with this `key`: a symbolic program runs at the
        sizes it read (one lookup, no second read); where no output can alias an input, the
        executor is called on the sequence as it is; anything else as `run_unchecked`."""
        if self._may_alias or self._copied:
            return self.run_unchecked(inputs)
        if self._by_key:
            return self.executor.run(key, inputs)  # type: ignore[attr-defined]
        return self.executor(inputs)  # type: ignore[arg-type]

    def run_unchecked(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run without input checks, for callers whose own guards already ensure the types
        (Dynamo guards every input's shape, dtype and device before calling a compiled graph)."""
        outputs = self.executor(list(inputs))
        if self._may_alias:
            return _unalias(outputs, inputs, self._placed)
        for k in self._copied:
            outputs[k] = outputs[k].clone()
        return outputs

    def profile(self, *inputs: torch.Tensor, reps: int = 20, threads: int | None = None) -> list[Any]:
        """Run the graph `reps` times (after 2 warm-up runs) on a timing build of its kernels; one
        `KernelProfile` per kernel and torch step in run order: `.name`, `.predicted_s` (the cost
        model), `.measured_s` (median), `.ratio` (`runtime/profile.py`). Native graphs only.
        `threads`: run on that many threads, predicted for that many cores."""
        from vfuse.runtime.profile import profile_executor

        self.check_inputs(inputs)
        return profile_executor(self.executor, inputs, reps, threads)

    @property
    def unchecked_runner(self) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]:
        """`run_unchecked` as the shortest callable: the executor itself when no output can
        alias (executors only index their input sequence, so a tuple or list will do)."""
        return self.run_unchecked if self._may_alias or self._copied else self.executor


def _never(inputs: Sequence[object]) -> None:
    return None  # symbolic sizes read by an executor that does not say where: the full checks


def _shape_fits(got: torch.Size, shape: tuple) -> bool:
    return len(got) == len(shape) and all(is_sym(s) or g == s for g, s in zip(got, shape))


def _unalias(
    outputs: list[torch.Tensor], inputs: Sequence[torch.Tensor], placed: Collection[int] = ()
) -> list[torch.Tensor]:
    """Copy outputs that share memory with an input or an earlier output: the graph promised
    fresh tensors, and a pass may have reduced e.g. `x.clone()` to the input itself. Outputs at
    `placed` share a storage by design (their own bytes of it): kept, once each."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    own: set[int] = set()
    fresh = []
    for k, o in enumerate(outputs):
        if k in placed:
            own.add(id(o))
        elif isinstance(o, torch.Tensor) and o.numel():
            ptr = o.untyped_storage().data_ptr()
            if ptr in taken or id(o) in own:
                o = o.clone()
                ptr = o.untyped_storage().data_ptr()
            taken.add(ptr)
        fresh.append(o)
    return fresh
