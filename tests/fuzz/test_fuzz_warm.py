"""Differential fuzzing of the warm compile: programs kept on disk and loaded by a later process.

Each drawn program (graphs.py's forward programs at fixed shapes; graphs_dynamic.py's over
symbolic sizes) is compiled by torch.compile(backend=vfuse, strict) with a cache directory of
its own; then, after torch._dynamo.reset() and with a new backend that shares only that directory
(as a later process would), it is compiled again and called at the first sizes and, over symbolic
sizes, at others. Every call is compared with eager and a float64 reference (check.py), and a
program the first backend kept must be loaded by the second at the first sizes (a hit; it keeps
nothing new), symbolic ones included since issue 15's fix (the later process's Dynamo narrowed a
symbol's range, and a kept program then had to have equal ranges: tests/dynamic/test_program_cache.py).
Programs are kept since session 15 for fixed shapes too and with torch fallbacks (an op pickled by
name): new ways for a later process to run something else than what was compiled.
`make test` draws the same programs every run; `make fuzz` new ones.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import NUDGES, check_outputs, fuzz_settings, per_output, quiet, reference
from tests.fuzz.check_dynamic import _expected
from tests.fuzz.graphs import Config, programs
from tests.fuzz.graphs_dynamic import DYN_KINDS, MARKERS, MID, SMALL, dyn_programs, instantiate
from tests.fuzz.graphs_dynamic import apply as dyn_apply
from tests.fuzz.ops import apply
from tests.fuzz.program import Program, build, make_inputs

import vfuse

STATIC_EXAMPLES = 2
DYNAMIC_EXAMPLES = 2
DYNAMIC = Config(
    dtypes=(torch.float32,) * 4 + (torch.float64, torch.int64), kinds=DYN_KINDS, max_numel=2048, large=False
)


def _cache_dir() -> tempfile.TemporaryDirectory:
    """A cache directory of an example's own, removed ignoring errors: the prelude's background
    build (codegen/cpp/pch.py) may still write into it when the example ends (seen once)."""
    return tempfile.TemporaryDirectory(ignore_cleanup_errors=True)


def _process(fn: Callable, cache_dir: str, dynamic: bool) -> tuple[Callable, Any]:
    """A compiled `fn` of a backend that shares only `cache_dir` with earlier ones."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True, backend="cpp", cache_dir=cache_dir)
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic), backend


def _expect_warm(first: Any, second: Any) -> None:
    saved = first.programs.saved
    assert second.programs.saved == 0, "the later process kept a program again"
    assert second.programs.hits == saved, f"{saved} programs kept, {second.programs.hits} loaded"
    assert first.stats["eager_graphs"] == second.stats["eager_graphs"] == 0


@fuzz_settings(STATIC_EXAMPLES)
@given(program=programs(Config()))
def test_kept_fixed_shape_programs_match_eager_in_a_later_process(program: Program) -> None:
    fn = build(program, apply)
    _, inputs = make_inputs(program)
    eager, ref = quiet(fn, *inputs), reference(program)
    nudged = per_output([quiet(fn, *make_inputs(program, perturb=k)[1]) for k in NUDGES])  # type: ignore[misc]
    with _cache_dir() as cache:
        backends = []
        for what in ("first process", "later process"):
            run, backend = _process(fn, cache, dynamic=False)
            check_outputs(quiet(run, *inputs), eager, ref, what, nudged)  # type: ignore[arg-type]
            backends.append(backend)
        _expect_warm(*backends)


def _call(run: Callable, program: Program, at: Sequence[int], what: str) -> None:
    p = instantiate(program, at)
    _, inputs = make_inputs(p)
    eager, nudged, ref = _expected(p, grad=False)
    check_outputs(list(quiet(run, *inputs)), eager[0], ref[0], f"{what} at {tuple(at)}", nudged[0])  # type: ignore[arg-type]


@fuzz_settings(DYNAMIC_EXAMPLES)
@given(program=dyn_programs(DYNAMIC), data=st.data())
def test_kept_symbolic_programs_match_eager_in_a_later_process(program: Program, data: st.DataObject) -> None:
    later = [(data.draw(st.sampled_from(SMALL)), data.draw(st.sampled_from(MID))) for _ in range(2)]
    fn = build(program, dyn_apply)
    # the steps' int params stay ints (check_dynamic's "dynamic" mode)
    with _cache_dir() as cache, torch._dynamo.config.patch(specialize_int=True):
        first, b1 = _process(fn, cache, dynamic=True)
        _call(first, program, MARKERS, "first process")
        second, b2 = _process(fn, cache, dynamic=True)
        _call(second, program, MARKERS, "later process")
        _expect_warm(b1, b2)
        for at in later:  # sizes outside the loaded guards compile (and keep) another variant
            _call(second, program, at, "later process")
