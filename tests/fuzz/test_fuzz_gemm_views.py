"""Differential fuzzing of GEMM epilogues read through a view of the GEMM's output
(tests/fuzz/graphs_gemm.py): a Linear, a view of its output, pointwise ops and maybe a reduction,
then a few random steps; forward vs eager (and backward) as the other fuzz tests check them. The
dynamic programs put a batch or sequence dim at a marker size (graphs_dynamic.py), compile once
over symbolic sizes (dynamic=True or mark_dynamic) and run at three other sizes vs eager
(check_dynamic.py). `make test` draws the same programs every run; `make fuzz` draws new ones
(tests/fuzz/soak.py)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st
from tests.fuzz.check import check_backward, check_forward, fuzz_settings
from tests.fuzz.check_dynamic import check_dynamic
from tests.fuzz.graphs import Config, Gen, grow
from tests.fuzz.graphs_dynamic import DynGen, marker_dims
from tests.fuzz.graphs_gemm import dyn_linear_view_epilogue, linear_view_epilogue
from tests.fuzz.graphs_motifs import MOTIFS
from tests.fuzz.graphs_ops import BUILDERS
from tests.fuzz.program import Kind, Program
from tests.fuzz.test_fuzz_backward import CONFIG as GRAD_CONFIG
from tests.fuzz.test_fuzz_dynamic import FORWARD as DYN_CONFIG
from tests.fuzz.test_fuzz_dynamic import size_plans

from vfuse.codegen.cpp.contraction import _groups

FORWARD_EXAMPLES = 3
BACKWARD_EXAMPLES = 2
DYNAMIC_EXAMPLES = 2


@st.composite
def _programs(draw: Any, cfg: Config) -> Program:
    g = Gen(draw, cfg)
    assume(linear_view_epilogue(g) is not None)
    if draw(st.integers(0, 3)) == 0:
        more = dataclasses.replace(cfg, min_steps=0, max_steps=2)
        grow(g, more, [BUILDERS[k] for k in cfg.kinds if k in BUILDERS], MOTIFS)
    outputs = (len(g.vals) - 1, *((draw(st.integers(0, len(g.vals) - 1)),) if draw(st.booleans()) else ()))
    return g.program(tuple(dict.fromkeys(outputs)), draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(FORWARD_EXAMPLES)
@given(program=_programs(Config()), export=st.integers(0, 3).map(lambda k: k == 0))
def test_gemm_epilogues_through_views_match_eager(program: Program, export: bool) -> None:
    stats = check_forward(program, export)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]


@fuzz_settings(BACKWARD_EXAMPLES)
@given(program=_programs(GRAD_CONFIG))
def test_gemm_epilogues_through_views_have_eager_gradients(program: Program) -> None:
    stats = check_backward(program)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]


@st.composite
def _dyn_programs(draw: Any) -> Program:
    g = DynGen(draw, DYN_CONFIG)
    y = dyn_linear_view_epilogue(g)
    if y is None or not any(marker_dims(s) for s in g.inputs) or not any(s.kind is Kind.LINEAR for s in g.steps):
        reject()
    outputs = (len(g.vals) - 1, *((draw(st.integers(0, len(g.vals) - 1)),) if draw(st.booleans()) else ()))
    return g.program(tuple(dict.fromkeys(outputs)), draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(DYNAMIC_EXAMPLES)
@given(program=_dyn_programs(), data=st.data())
def test_gemm_epilogues_through_views_over_symbolic_sizes_match_eager(program: Program, data: st.DataObject) -> None:
    sizes = data.draw(size_plans(program), label="sizes")
    stats = check_dynamic(program, sizes, data.draw(st.sampled_from(("dynamic", "mark")), label="mode"), False)
    assert stats["eager_graphs"] == 0


@st.composite
def _view_pairs(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A GEMM output shape and a view of it: dims merged, split, refactored, with 1s anywhere."""
    shape = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 4, 5, 6, 7, 12)), min_size=1, max_size=4)))
    primes = [p for n in shape for p in _prime_factors(n)]
    dims = [1] * draw(st.integers(1, 5))
    for p in primes:
        dims[draw(st.integers(0, len(dims) - 1))] *= p
    return shape, tuple(dims)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out, n = [*out, p], n // p
        p += 1
    return out


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(pair=_view_pairs())
def test_view_groups_partition_both_shapes_in_equal_spans(pair: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    """contraction._groups: consecutive groups covering every dim of the view in order (each is named
    from them) and every output dim but size-1 ones (index 0), each pair spanning as many elements:
    what makes a group's row-major index the output's flat index."""
    shape, space = pair
    groups = _groups(shape, space)
    covered = [d for a, _ in groups for d in a]
    assert covered == sorted(covered) and all(shape[d] == 1 for d in range(len(shape)) if d not in covered), groups
    assert [d for _, b in groups for d in b] == list(range(len(space))), groups
    for a, b in groups:
        assert math.prod(shape[d] for d in a) == math.prod(space[d] for d in b), (shape, space, groups)
