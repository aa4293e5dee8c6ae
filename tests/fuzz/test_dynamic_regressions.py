"""Dynamic-shape fuzz counterexamples (tests/fuzz/test_fuzz_dynamic.py), kept as regression tests.

Int params that torch.compile(dynamic=True) makes SymInt graph inputs (Dynamo lifts the ints a
closure holds unless specialize_int) gave wrong values or a crash: an output that is a view of an
input was rebuilt by AOTAutograd from the kernel's fresh output (entry/dynamic.py AliasOutput).
"""

from __future__ import annotations

import pytest
import torch
from tests.fuzz.check_dynamic import check_dynamic
from tests.fuzz.graphs_dynamic import SV, DynKind
from tests.fuzz.ops import B, N, R, U, V
from tests.fuzz.program import Input, Kind, Layout, Program, Step

X = Step(kind=Kind.INPUT, params=(0,))


def _program(step: Step, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Program:
    return Program(inputs=(Input(shape=shape, dtype=dtype),), steps=(X, step), outputs=(1,), seed=10376)


# x[1:3:2] gave row 0 (AOTAutograd rebuilt the view from the kernel's output: offset 0),
# x.unsqueeze(0).expand(5, ...) raised "setStorage: ... out of bounds" for the same reason.
LIFTED = [
    pytest.param(_program(Step(DynKind.SYMVIEW, SV.SLICE, (0,), (0, 1, 3, 2)), (11, 16), torch.int32), id="slice"),
    pytest.param(_program(Step(DynKind.SYMVIEW, SV.EXPAND_NEW, (0,), (0, 5)), (11,)), id="expand"),
]


@pytest.mark.parametrize("program", LIFTED)
def test_int_params_lifted_to_symints(program: Program) -> None:
    check_dynamic(program, [(5, 37)], "ints", grad=False)


@pytest.mark.parametrize("program", LIFTED)
def test_int_params_specialized(program: Program) -> None:
    check_dynamic(program, [(5, 37), (64, 37)], "dynamic", grad=False)


# A symbolic head size reached the flash-attention template's constexpr D ("'seeds' was not
# declared"): the schedule now specializes head sizes (an equality guard), lengths stay symbolic.
def test_attention_with_a_symbolic_head_size() -> None:
    inputs = (
        Input((2, 1, 2, 11), torch.float32),
        Input((2, 1, 7, 11), torch.float32),
        Input((2, 1, 7, 11), torch.float32),
    )
    steps = (
        X,
        Step(Kind.INPUT, params=(1,)),
        Step(Kind.INPUT, params=(2,)),
        Step(Kind.SDPA, None, (0, 1, 2), (True, None)),
    )
    for mode in ("dynamic", "mark"):
        stats = check_dynamic(Program(inputs, steps, (3,), seed=1), [(2, 31), (64, 5)], mode, grad=False)
        assert stats["symbolic"] >= 1


# The arena placed buffers largest first, comparing symbolic sizes: an ordering guard (here
# s0 >= 8 for a [s0] buffer against a [8] one) compiled the backward again at s0 = 5.
def test_arena_order_takes_no_guard() -> None:
    inputs = (Input((11, 6, 4), torch.float32), Input((8, 11), torch.float32), Input((8,), torch.float32))
    steps = (
        X,
        Step(Kind.REDUCE, R.AMAX, (0,), ((1, 2), False, 0)),
        Step(Kind.UNARY, U.SIGMOID, (1,)),
        Step(Kind.INPUT, params=(1,)),
        Step(Kind.INPUT, params=(2,)),
        Step(Kind.LINEAR, None, (2, 3, 4), (True,)),
    )
    stats = check_dynamic(Program(inputs, steps, (5, 1), seed=97727), [(5, 16), (64, 37)], "dynamic", grad=True)
    assert stats["recompiles"] == [] and stats["graphs"] == 2  # forward, backward


# x.mean()'s backward has one 0-d tensor input (its symbols come from SymInt arguments): the
# program listed no symbols, so its kernel read undeclared vf_s* ("'vf_s33' was not declared").
def test_backward_whose_symbols_no_tensor_input_carries() -> None:
    steps = (X, Step(Kind.REDUCE, R.MEAN, (0,), (None, True, 0)))
    program = Program((Input((3, 7, 11), torch.float64),), steps, (1,), seed=0)
    stats = check_dynamic(program, [(5, 37), (64, 2)], "dynamic", grad=True)
    assert stats["symbolic"] == 2 and stats["recompiles"] == []


# The int8-dot check compared K with its limit before looking for int8 operands: every fp32
# GEMM with a symbolic K (here the weight gradient's, K = batch) took the guard K <= 65536 and
# compiled again past it.
def test_fp32_gemm_takes_no_int8_guard() -> None:
    inputs = (Input((11, 2), torch.float32), Input((2,), torch.float32), Input((2, 2), torch.float32))
    steps = (
        X,
        Step(Kind.INPUT, params=(1,)),
        Step(Kind.NORM, N.LAYER, (0, 1), (1, 1e-05, True, False)),
        Step(Kind.INPUT, params=(2,)),
        Step(Kind.LINEAR, None, (2, 3), (False,)),
        Step(Kind.BINARY, B.ADD, (0, 4)),
    )
    stats = check_dynamic(Program(inputs, steps, (5,), seed=2), [(262147, 37)], "dynamic", grad=True)
    assert stats["recompiles"] == [] and stats["graphs"] == 2  # forward, backward


# A grouped conv's weight gradient over symbolic sizes takes the folded template, which reads the
# swapped operands in place of one group only: the schedule asked it to for 3 groups (a codegen
# error, found by make fuzz); it now reads them through the prologue.
def test_grouped_weight_gradient_over_symbolic_sizes() -> None:
    f32, t = torch.float32, Layout.TRANSPOSED
    ins = (
        Input((11, 37), f32),
        Input((1, 3, 7, 6), f32),
        Input((3, 1, 1, 2), f32, layout=t),
        Input((3,), f32),
        Input((3,), f32),
    )
    steps = (
        *(Step(Kind.INPUT, params=(i,)) for i in range(3)),
        Step(Kind.CONV, srcs=(1, 2), params=(1, 1, 1, 3)),
        Step(Kind.INPUT, params=(3,)),
        Step(Kind.INPUT, params=(4,)),
        Step(Kind.NORM, N.BATCH_TRAIN, (3, 4, 5), (0, 1e-05, True, True)),
        Step(Kind.UNARY, U.RELU, (6,)),
    )
    check_dynamic(Program(ins, steps, (7, 0), seed=2867958), [(16411, 37), (255, 5), (17, 15)], "dynamic", grad=True)


# The gradient of sum(softmax(x)) over the softmax's dim is 0 by cancellation (p (1 - sum p)):
# eager's sum of p was exactly 1 on the program's inputs and two nudged sets, vfuse's an ulp off
# (1.9e-9 against eager's 0); a third and fourth nudged set show eager's own 2e-9 (check.NUDGES).
def test_gradient_of_a_softmax_summed_over_its_dim() -> None:
    f32, t = torch.float32, Layout.TRANSPOSED
    ins = (Input((2, 37, 1), f32), Input((2, 1, 1), f32, layout=Layout.SLICED), Input((1, 1), f32, layout=t))
    ins += (Input((1,), f32), Input((1, 16), f32, layout=t))
    steps = (
        *(Step(Kind.INPUT, params=(i,)) for i in range(2)),
        Step(Kind.NORM, N.RMS, (1,), (1, 1e-05, False, False)),
        *(Step(Kind.INPUT, params=(i,)) for i in (2, 3)),
        Step(Kind.LINEAR, None, (2, 3, 4), (True,)),
        Step(Kind.BINARY, B.ADD, (1, 5)),
        Step(Kind.INPUT, params=(4,)),
        Step(Kind.MATMUL, srcs=(6, 7)),
        Step(Kind.VIEW, V.PERMUTE, (7,), ((1, 0),)),
        Step(Kind.NORM, N.SOFTMAX, (9,), (0, 0.0, False, False)),
        Step(Kind.REDUCE, R.SUM, (10,), ((0,), True, 0)),
    )
    check_dynamic(Program(ins, steps, (11,), seed=6963), [(2, 2), (31, 2), (262147, 37)], "dynamic", grad=True)
