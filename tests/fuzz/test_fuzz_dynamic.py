"""Differential fuzzing of dynamic shapes: random programs compiled once over symbolic sizes.

Each program (graphs_dynamic.py) is drawn at marker sizes in one or two dims (batch, sequence, a
reduced dim, a GEMM M dim, as its steps use them) and views relative to the runtime shape
(reshapes keeping dims, relative slices, expands, permutes). torch.compile(backend=vfuse,
strict) compiles it on the first call with those dims symbolic (dynamic=True, or mark_dynamic on
the marker dims); it is then called at three other sizes (small and threshold-crossing ones, and
one past L2) and compared with eager and a float64 reference each time; a size every guard
admits must not compile again (tests/fuzz/check_dynamic.py). Backward programs compare the
gradients too. `make test` draws the same programs every run; `make fuzz` draws new ones.
"""

from __future__ import annotations

import os

import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import fuzz_settings
from tests.fuzz.check_dynamic import check_dynamic, large_size
from tests.fuzz.graphs import Config
from tests.fuzz.graphs_dynamic import DYN_KINDS, MARKERS, MID, SMALL, dyn_programs
from tests.fuzz.program import Kind, Program

# "ints" (int params as SymInt graph inputs) only when asked: its known bug fails most programs
# (test_dynamic_regressions.py).
MODES = ("dynamic", "dynamic", "mark", *(("ints",) if os.environ.get("VFUSE_FUZZ_DYN_INTS") else ()))
# Halved in session 18 (were 16 and 8) to keep `make test` near 20 minutes; `make fuzz` draws many more.
FORWARD_EXAMPLES = 8
BACKWARD_EXAMPLES = 4
FORWARD = Config(
    dtypes=(torch.float32,) * 6 + (torch.float64, torch.int32, torch.int64, torch.bool),
    kinds=DYN_KINDS,
    max_numel=2048,
    large=False,
)
BACKWARD = Config(
    dtypes=(torch.float32, torch.float32, torch.float64),
    kinds=tuple(k for k in DYN_KINDS if k is not Kind.CAST),
    max_numel=1024,
    large=False,
    grad=True,
)


@st.composite
def size_plans(draw: st.DrawFn, program: Program) -> list[tuple[int, int]]:
    """Three sizes of the markers after the first call: a small one, a mid one and a large one
    (one marker past L2 when the program's values stay under the cap), in a drawn order."""
    which = draw(st.integers(0, len(MARKERS) - 1))
    large = large_size(program, which)
    plans = [
        (draw(st.sampled_from(SMALL)), draw(st.sampled_from(SMALL + MID))),
        (draw(st.sampled_from(MID)), draw(st.sampled_from(SMALL))),
        tuple(large if i == which and large else m for i, m in enumerate((draw(st.sampled_from(MID)), MARKERS[1]))),
    ]
    return draw(st.permutations(plans))  # type: ignore[arg-type]


def _check(data: st.DataObject, program: Program, grad: bool) -> None:
    sizes = data.draw(size_plans(program), label="sizes")
    mode = data.draw(st.sampled_from(MODES), label="mode")
    stats = check_dynamic(program, sizes, mode, grad)
    assert stats["eager_graphs"] == 0


@fuzz_settings(FORWARD_EXAMPLES)
@given(program=dyn_programs(FORWARD), data=st.data())
def test_dynamic_programs_match_eager_at_every_size(program: Program, data: st.DataObject) -> None:
    _check(data, program, grad=False)


@fuzz_settings(BACKWARD_EXAMPLES)
@given(program=dyn_programs(BACKWARD), data=st.data())
def test_dynamic_programs_have_eager_gradients_at_every_size(program: Program, data: st.DataObject) -> None:
    _check(data, program, grad=True)
