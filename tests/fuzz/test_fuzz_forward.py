"""Differential fuzzing, forward: random programs through vfuse's captures vs eager.

Each drawn program runs through torch.compile(backend=vfuse) on the generated C++ and on the
reference executor (strict: a lowering or codegen failure raises), and a quarter of them also
through vfuse.compile (torch.export); every output is compared with eager and a float64
reference (tests/fuzz/check.py). `make test` draws the same FORWARD_EXAMPLES programs every run;
`make fuzz` draws new ones for minutes (tests/fuzz/soak.py).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.check import check_forward, fuzz_settings
from tests.fuzz.graphs import Config, programs
from tests.fuzz.program import Program

# 25 keeps `make test` near 20 minutes on 2 cores (50 until session 18); `make fuzz` draws many more.
FORWARD_EXAMPLES = 25
CONFIG = Config()


@fuzz_settings(FORWARD_EXAMPLES)
@given(program=programs(CONFIG), export=st.integers(0, 3).map(lambda k: k == 0))
def test_random_programs_match_eager(program: Program, export: bool) -> None:
    stats = check_forward(program, export)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]
