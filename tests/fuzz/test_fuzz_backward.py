"""Differential fuzzing, backward: gradients of random float programs vs eager.

Programs of float32/float64 values (no casts, so a float64 run of the same program is the
reference) with every float input requiring grad; the loss is sum(output * fixed random
weights). The forward and backward graphs AOTAutograd hands vfuse both run on the generated C++
and on the reference executor; outputs and gradients are compared with eager and the reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from tests.fuzz.check import check_backward, fuzz_settings
from tests.fuzz.graphs import KINDS, Config, Gen, draw_main_input, grow, programs
from tests.fuzz.graphs_motifs import MOTIFS, stacked_attention, written_attention
from tests.fuzz.graphs_ops import BUILDERS
from tests.fuzz.program import Kind, Program

# Halved in session 18 (was 20) to keep `make test` near 20 minutes; `make fuzz` draws many more.
BACKWARD_EXAMPLES = 10
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


ATTENTION_EXAMPLES = 3


@st.composite
def _attention_programs(draw: Any) -> Program:
    """Written-out attention (graphs_motifs.written_attention over a drawn 3-D or 4-D input, or
    stacked_attention over one permuted qkv projection), then a
    few more random steps: in training the capture rewrites it into the flash kernels where exact."""
    g = Gen(draw, CONFIG)
    base = draw(st.sampled_from([(2, 7, 8), (1, 2, 5, 4), (2, 3, 16, 8), (1, 1, 33, 16)]))
    draw_main_input(g, base, draw(st.sampled_from([torch.float32, torch.float32, torch.float64])))
    assume((stacked_attention(g) if draw(st.booleans()) else written_attention(g)) is not None)
    grow(g, dataclasses.replace(CONFIG, min_steps=0, max_steps=3), [BUILDERS[k] for k in CONFIG.kinds], MOTIFS)
    return g.program((len(g.vals) - 1,), draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(ATTENTION_EXAMPLES)
@given(program=_attention_programs())
def test_written_out_attention_has_eager_gradients(program: Program) -> None:
    stats = check_backward(program)
    assert all(s["eager_graphs"] == 0 for s in stats.values())  # type: ignore[index]
