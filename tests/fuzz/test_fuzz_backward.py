"""Differential fuzzing, backward: gradients of random float programs vs eager.

Programs of float32/float64 values (no casts, so a float64 run of the same program is the
reference) with every float input requiring grad; the loss is sum(output * fixed random
weights). The forward and backward graphs AOTAutograd hands vfuse both run on the generated C++
and on the reference executor; outputs and gradients are compared with eager and the reference.
"""

from __future__ import annotations

import torch
from hypothesis import given
from tests.fuzz.check import check_backward, fuzz_settings
from tests.fuzz.graphs import KINDS, Config, programs
from tests.fuzz.program import Kind, Program

BACKWARD_EXAMPLES = 20
CONFIG = Config(
    dtypes=(torch.float32, torch.float32, torch.float64),
    kinds=tuple(k for k in KINDS if k is not Kind.CAST),
    max_numel=1024,
    large=False,
    grad=True,
)


@fuzz_settings(BACKWARD_EXAMPLES)
@given(program=programs(CONFIG))
def test_random_programs_have_eager_gradients(program: Program) -> None:
    stats = check_backward(program)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]
