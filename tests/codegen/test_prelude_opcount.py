"""How many multiplies and FMAs the prelude's fp32 exp, GELU, SiLU and sigmoid cost per vector.

The row kernels that use them (softmax, rms_silu, ln_gelu) are bound by these operations on the
two FMA pipes of an AVX2 core, not by memory (docs/perf-log.md): each one saved is a few percent
of the kernel. The budgets are the current forms' counts (exp's degree-6 minimax, GELU's rational
by Estrin's scheme), so a change that adds one fails here and has to say why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.codegen.prelude_asm import body, prelude_asm

from vfuse.targets.cpu import isa_for
from vfuse.targets.isa import Isa

# packed multiplies and FMAs per loop body (one vector per iteration, no epilogue at 4096)
# vf_tanh / vf_gelu_tanh: exp's reduction and polynomial, one fma for expm1 or 1 + exp; GELU-tanh
# 3 more for its argument (SiLU's 10 + 3); inline, no libmvec call.
BUDGET = {
    "vf_exp_nonpos": 10,
    "vf_exp": 11,
    "vf_gelu_none": 15,
    "vf_silu": 10,
    "vf_sigmoid": 10,
    "vf_tanh": 10,
    "vf_gelu_tanh": 13,
}
# AVX-512 (g++ 12, Zen 4): tanh's select on |x| becomes a masked multiply (`vmulps ...{%k1}`): 11
# counted ops there, 10 in the AVX2 build of the same source.
AVX512_BUDGET = {**BUDGET, "vf_tanh": 11}
MUL_FMA = re.compile(r"^\s+v(fn?m(add|sub)\d*|mul)ps\s")


def _assembly(tmp_path: Path) -> str:
    loops = "".join(
        f'extern "C" void t_{fn}(const float* __restrict x, float* __restrict y) {{\n'
        f"#pragma omp simd\n  for (int i = 0; i < 4096; ++i) y[i] = {fn}(x[i]);\n}}\n"
        for fn in BUDGET
    )
    return prelude_asm(tmp_path, loops)


@pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="no FMA at the generic tier: other counts")
def test_multiplies_and_fmas_per_vector_within_budget(tmp_path: Path) -> None:
    asm = _assembly(tmp_path)
    budgets = AVX512_BUDGET if isa_for(None).tier is Isa.AVX512 else BUDGET
    for fn, budget in budgets.items():
        code = body(asm, f"t_{fn}")
        ops = [line.strip() for line in code.splitlines() if MUL_FMA.match(line)]
        assert "call" not in code and 0 < len(ops) <= budget, (fn, len(ops), ops)


INT_OPS = re.compile(r"^\s+vp(and|andn|or|xor|min|max|ternlog)\w*\s")


@pytest.mark.skipif(isa_for(None).tier is Isa.GENERIC, reason="no FMA at the generic tier: other counts")
def test_gelu_takes_abs_and_clamp_in_two_integer_ops(tmp_path: Path) -> None:
    # |x| and min(|x|, 5.6) on the bits; the sign is never put back (gelu = |x| e + x/2): a
    # symmetric clamp took two more integer ops per vector in ln_gelu's FMA-bound output loop.
    code = body(_assembly(tmp_path), "t_vf_gelu_none")
    ops = [line.strip() for line in code.splitlines() if INT_OPS.match(line)]
    assert 0 < len(ops) <= 2, ops
