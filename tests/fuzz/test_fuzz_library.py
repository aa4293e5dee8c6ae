"""Differential fuzzing of the torch side of template-or-library verdicts: the forward fuzz's programs
(GEMMs with epilogues, convs, written-out attention that inference rewrites into SDPA, ...) planned
with every contraction the CPU verdict may send to torch in torch, so they run in torch
steps (`schedule/build._library_steps`: producers op by op, SDPA with its masks and GQA, the epilogue
fused after) and are compared with eager as every fuzz program is. `make fuzz` draws new ones."""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Iterator
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import check_forward, fuzz_settings
from tests.fuzz.graphs import Config, programs
from tests.fuzz.program import Program

from vfuse.fusion import library

build = importlib.import_module("vfuse.schedule.build")  # the package exports a function of that name

EXAMPLES = 10


@contextlib.contextmanager
def torch_side_everywhere() -> Iterator[None]:
    """Every contraction the CPU verdict may send to torch goes there (those it keeps as templates by
    rule, with vfuse's dropout mask or in training's forms, stay)."""
    real = build.library_choice

    def choice(*args: object, **kwargs: object) -> library.ContractionChoice:
        verdict = real(*args, **kwargs)  # type: ignore[arg-type]
        return verdict if math.isinf(verdict.library_s) else library.ContractionChoice(1.0, 0.0, verdict.efficiency)

    with mock.patch.object(build, "library_choice", choice):
        yield


@fuzz_settings(EXAMPLES)
@given(program=programs(Config()), export=st.integers(0, 3).map(lambda k: k == 0))
def test_contractions_in_torch_match_eager(program: Program, export: bool) -> None:
    with torch_side_everywhere():
        stats = check_forward(program, export)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]
