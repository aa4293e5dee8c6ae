"""Run a dynamic-shape fuzz program (graphs_dynamic.py) compiled once, at several sizes, vs eager.

The program is compiled by torch.compile(backend=vfuse, strict) with its marker dims symbolic
(dynamic=True: every dim; or mark_dynamic on the marker dims only) on the first call, at the
marker sizes, then called at other sizes of the markers. Each call's outputs (and, with `grad`,
the gradients of sum(output * fixed weights)) are compared with eager and a float64 reference
as check.py does. A call at sizes that every graph compiled so far admits (its guards hold at
those sizes) must compile nothing; a graph that falls back to per-shape compilation fails.
`VFUSE_FUZZ_DYN_LOG=file` appends, per program, the guards that made a size compile again and
where each was taken (SymEnv.trace) as JSON lines.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from hypothesis import reject
from tests.fuzz.check import (
    NUDGES,
    approximation_floors,
    cancel_scale,
    check_outputs,
    float64_default,
    per_output,
    quiet,
    widen,
)
from tests.fuzz.graphs_dynamic import MARKERS, apply, instantiate, marker_dims
from tests.fuzz.program import Kind, Program, build, loss_weights, make_inputs

import vfuse
import vfuse.entry.dynamic as entry_dynamic
from vfuse.runtime.symbolic import SymbolicExecutor

MAX_LARGE_NUMEL = 1 << 21  # elements of the largest value at the large size (under ~16 MiB f64)
LARGE = (262147, 65537, 16411, 4099, 1031)  # primes; the first that keeps values under the cap


def large_size(program: Program, which: int) -> int | None:
    """The largest LARGE value of marker `which` (others at their marker) that keeps every
    step's value under MAX_LARGE_NUMEL elements (shapes computed on the meta device)."""
    for n in LARGE:
        sizes = [n if i == which else m for i, m in enumerate(MARKERS)]
        worst = _max_numel(instantiate(program, sizes))
        if worst is not None and worst <= MAX_LARGE_NUMEL:
            return n
    return None


def _max_numel(p: Program) -> int | None:
    values: list[torch.Tensor] = []
    work: list[int] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step in p.steps:
                if step.kind is Kind.INPUT:
                    spec = p.inputs[step.params[0]]
                    values.append(torch.empty(spec.shape, dtype=spec.dtype, device="meta"))
                else:
                    values.append(apply(step, values))
                if step.kind is Kind.SDPA:  # its work is Lq x Lk per head: count that too
                    q, k = values[step.srcs[0]], values[step.srcs[1]]
                    work.append(math.prod(q.shape) * k.shape[-2])
    except Exception:
        return None
    return max([math.prod(v.shape) for v in values] + work)


@contextlib.contextmanager
def traced_guards(on: bool) -> Iterator[None]:
    """Each SymEnv made by the dynamic entry records where its guards come from."""
    if not on:
        yield
        return
    real = entry_dynamic.sym_env

    def sym_env(*args: Any, **kw: Any) -> Any:
        env = real(*args, **kw)
        if env is not None:
            env.trace = {}
        return env

    entry_dynamic.sym_env = sym_env  # type: ignore[assignment]
    try:
        yield
    finally:
        entry_dynamic.sym_env = real  # type: ignore[assignment]


# Why compile_symbolic may refuse a graph by design (it is then compiled per shape).
KNOWN_PER_SHAPE = ("need constant sizes", "need a fixed arena", "compiles per shape")
# Lowering gaps found by this fuzzer and reported (issue 15), tolerated by `make test` only
# (`make fuzz`, VFUSE_FUZZ=soak, fails on them): SDPA's scale 1/sqrt(E) as a SymFloat over a
# symbolic head dim; aten.as_strided of symbolic sizes (conv / group norm decompositions).
REPORTED = ("symbolic scalar", "Cannot call numel() on tensor with symbolic sizes")


def tolerated(refusal: str) -> bool:
    known = KNOWN_PER_SHAPE if os.environ.get("VFUSE_FUZZ") == "soak" else KNOWN_PER_SHAPE + REPORTED
    return any(k in refusal for k in known)


def record_refusals(backend: Any, refusals: list[str]) -> None:
    """Each exception compile_symbolic raises (entry/dynamic.py turns it into a warning and
    compiles per shape) is appended to `refusals`."""
    real = backend.compile_symbolic

    def compile_symbolic(*args: Any, **kw: Any) -> Any:
        try:
            return real(*args, **kw)
        except Exception as e:
            refusals.append(f"{type(e).__name__}: {e}".splitlines()[0])
            raise

    backend.compile_symbolic = compile_symbolic


def _frames() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _symbolic(backend: Any, start: int) -> list[Any]:
    return [c.executor.env for c in backend.compiled[start:] if isinstance(c.executor, SymbolicExecutor)]


def _at(env: Any, compiled_at: Sequence[int], sizes: Sequence[int]) -> dict[sympy.Symbol, int] | None:
    """The env's symbols at `sizes`: a symbol whose hint was a marker's size then takes that
    marker's new size (None when a hint matches two markers' sizes: ambiguous)."""
    out = {}
    for s, h in env.hints.items():
        hits = [i for i, m in enumerate(compiled_at) if m == h]
        if len(hits) > 1:
            return None
        out[s] = sizes[hits[0]] if hits else h
    return out


def failing_guards(envs: Sequence[tuple[Any, Sequence[int]]], sizes: Sequence[int]) -> list[tuple[str, str]] | None:
    """The guards (with where taken) of the compiled graphs that fail at `sizes`; None if unknown."""
    failed = []
    for env, at in envs:
        values = _at(env, at, sizes)
        if values is None:
            return None
        for g in env.guards:
            if not bool(g.xreplace(values)):
                failed.append((str(g), (env.trace or {}).get(g, "")))
    return failed


def _inputs(program: Program, mode: str, grad: bool, **kw: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    leaves, inputs = make_inputs(program, grad=grad, **kw)
    if mode == "mark":
        for spec, x in zip(program.inputs, inputs):
            for d in marker_dims(spec):
                torch._dynamo.mark_dynamic(x, d)
    return leaves, inputs


def _run(fn: Callable, program: Program, grad: bool, mode: str = "", **kw: Any) -> tuple[list, list]:
    """Outputs (and gradients of sum(output * weights) w.r.t. float leaves with `grad`);
    `kw`: make_inputs' (double, perturb)."""
    leaves, inputs = _inputs(program, mode, grad, **kw)
    outs = quiet(fn, *inputs)
    if not grad:
        return list(outs), []  # type: ignore[arg-type]
    weights = loss_weights(outs, program.seed)  # type: ignore[arg-type]
    terms = [(o * w.to(o.dtype)).sum() for o, w in zip(outs, weights) if o.requires_grad]  # type: ignore[union-attr]
    wrt = [x for x in leaves if x.requires_grad]
    if not terms or not wrt:
        return [o.detach() for o in outs], []  # type: ignore[union-attr]
    grads = torch.autograd.grad(sum(terms), wrt, allow_unused=True)
    return [o.detach() for o in outs], [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wrt)]  # type: ignore[union-attr]


def _expected(program: Program, grad: bool) -> tuple[tuple, tuple, tuple]:
    """(eager, nudged, float64 reference) outputs and gradients at the program's sizes."""
    fn = build(program, apply)
    try:
        eager = _run(fn, program, grad)
    except RuntimeError:
        reject()  # eager has no backward for it
    runs = [_run(fn, program, grad, perturb=k) for k in NUDGES]
    nudged = (per_output([r[0] for r in runs]), per_output([r[1] for r in runs]))
    with float64_default():
        ref = _run(build(widen(program), apply), program, grad, double=True)
    return eager, nudged, ref


def check_dynamic(program: Program, sizes: Sequence[Sequence[int]], mode: str, grad: bool) -> dict[str, Any]:
    """Compile once at the marker sizes, then run at each of `sizes` (module docstring). `mode`:
    "dynamic" (dynamic=True), "mark" (mark_dynamic on the marker dims), "ints" (dynamic=True
    with the steps' int params symbolic too: slice bounds, expand sizes)."""
    log = os.environ.get("VFUSE_FUZZ_DYN_LOG")
    backend = vfuse.backend(strict=True, backend="cpp")
    torch._dynamo.reset()
    run = torch.compile(
        build(program, apply), backend=backend, fullgraph=True, dynamic=None if mode == "mark" else True
    )
    state = _State(backend, mode, grad, {"program": repr(program), "mode": mode, "grad": grad, "recompiles": []})
    record_refusals(backend, state.refusals)
    # The steps' params are ints in a closure: Dynamo makes them SymInt graph inputs under
    # dynamic=True unless specialize_int; mode "ints" keeps them symbolic.
    with traced_guards(bool(log)), torch._dynamo.config.patch(specialize_int=mode != "ints"):
        for k, at in enumerate([MARKERS, *sizes]):
            _call(state, run, instantiate(program, at), at, k)
    record = state.record
    record["graphs"] = len(backend.compiled)
    record["symbolic"] = len(_symbolic(backend, 0))
    record["per_shape"] = sorted(set(state.refusals))
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
    return {**backend.stats, **record}


@dataclass
class _State:
    backend: Any
    mode: str
    grad: bool
    record: dict[str, Any]
    refusals: list[str] = field(default_factory=list)
    envs: list[tuple[Any, Sequence[int]]] = field(default_factory=list)  # (SymEnv, sizes compiled at)


def _call(state: _State, run: Callable, p: Program, at: Sequence[int], k: int) -> None:
    """Call k (0: the compiling one) at sizes `at`: compile count, then outputs vs eager."""
    backend, mode, grad = state.backend, state.mode, state.grad
    failed = failing_guards(state.envs, at) if k else None
    before, frames = len(backend.compiled), _frames()
    got = _run(run, p, grad, mode)
    what = f"sizes {tuple(at)} (call {k + 1}, {mode})"
    unknown = [r for r in state.refusals if not tolerated(r)]
    assert not unknown, f"{what}: a graph with symbolic sizes is compiled per shape: {unknown[0]}"
    new = len(_symbolic(backend, before))
    if _frames() > frames:  # Dynamo traced again (its own guards): new graphs, new symbols
        state.record["dynamo_recompiles"] = state.record.get("dynamo_recompiles", 0) + 1
        state.envs.clear()
    else:
        assert not (failed == [] and new), f"{what}: {new} graphs compiled although every guard holds"
    if new and failed:
        state.record["recompiles"].append({"sizes": list(at), "guards": failed})
    state.envs += [(env, at) for env in _symbolic(backend, before)]
    eager, nudged, ref = _expected(p, grad)
    check_outputs(got[0], eager[0], ref[0], f"{what}, forward", nudged[0], approximation_floors(p))
    if grad:
        check_outputs(got[1], eager[1], ref[1], f"{what}, gradients", nudged[1], scale=cancel_scale(ref[0]))
