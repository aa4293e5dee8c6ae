"""Pointwise ops whose generated C++ loop calls scalar libm, and what such a call costs.

g++ vectorizes a loop calling libm only through glibc's vector math (libmvec), which vfuse does not
use: its vector bodies and scalar remainders differ in the last bits (codegen/cpp/prelude.py). These
ops therefore run one lane at a time, 3-25x slower than eager's vectorized SLEEF on the same tensor
(docs/perf-log.md, session 26). The cost model prices them as such (`scalar_flops`), and
`library.pointwise_choice` runs one in torch, alone, where that is predicted faster than any kernel
holding it. tests/fusion/test_libm_calls.py checks these sets against the C++ rules: exactly the ops
whose rendered loop has a call.
"""

from __future__ import annotations

from vfuse.ir import DType, Kind, Node, Op, TensorType
from vfuse.targets import Target
from vfuse.targets.isa import Isa

# fp32, fp16 and bf16 (computed in float): the C++ rule is a libm call.
FLOAT_CALLS: frozenset[Op] = frozenset(
    {
        Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.ASINH, Op.ACOSH, Op.ATANH, Op.ERFC,
        Op.ATAN2, Op.POW, Op.FMOD, Op.REMAINDER, Op.FLOOR_DIV,
    }
)  # fmt: skip
# float64: the prelude's own fp32 functions (exp, exp2, logs, sinh, cosh, tanh, erf and what is built
# on them) fall back to libm too.
DOUBLE_CALLS: frozenset[Op] = FLOAT_CALLS | frozenset(
    {
        Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SINH, Op.COSH, Op.TANH,
        Op.ERF, Op.SIGMOID, Op.SILU, Op.GELU,
    }
)  # fmt: skip
# The x86-64 baseline (the generic tier, SSE2) has no rounding instruction: nearbyint is a call there.
GENERIC_CALLS: frozenset[Op] = frozenset({Op.ROUND})
FLOAT_DTYPES = (DType.F32, DType.F16, DType.BF16)

# One call's time in the target's vector flops per fp32 lane: a call per element costs this times
# the tier's lanes. Measured (session 26, Xeon AVX-512, 2 threads, 1M elements, one op per graph):
# time / (lanes / vector_f32) per element; float and double within 2x of each other, the larger kept.
SCALAR_FLOPS: dict[Op, float] = {
    Op.EXP2: 20, Op.SIN: 28, Op.COS: 25, Op.TAN: 56, Op.ASIN: 58, Op.ACOS: 60, Op.ATAN: 45,
    Op.SINH: 53, Op.COSH: 39, Op.ASINH: 90, Op.ACOSH: 90, Op.ATANH: 95, Op.ERFC: 28, Op.ATAN2: 98,
    Op.POW: 52, Op.FMOD: 23, Op.REMAINDER: 29, Op.FLOOR_DIV: 29, Op.EXP: 28, Op.EXPM1: 48, Op.LOG: 18,
    Op.LOG2: 18, Op.LOG10: 32, Op.LOG1P: 38, Op.TANH: 60, Op.ERF: 20, Op.SIGMOID: 18, Op.SILU: 20,
    Op.GELU: 25, Op.ROUND: 10,
}  # fmt: skip


def calls(dtype: DType, isa: Isa | None) -> frozenset[Op]:
    """The ops whose C++ loop over `dtype` calls libm at the tier `isa`."""
    tier = GENERIC_CALLS if isa is Isa.GENERIC else frozenset()
    if dtype is DType.F64:
        return DOUBLE_CALLS | tier
    return FLOAT_CALLS | tier if dtype in FLOAT_DTYPES else frozenset()


def scalar_call(node: Node, isa: Isa | None = None) -> bool:
    """Whether the node's C++ loop calls scalar libm once per element at the tier `isa`."""
    if node.kind is not Kind.ELEMENTWISE or not isinstance(node.type, TensorType):
        return False
    return node.op in calls(node.type.dtype, isa)


def scalar_flops(node: Node, target: Target) -> float:
    """Per element, what the node's scalar libm call costs in the target's vector flops (0.0: the
    node has no such call on this target; GPU code has vector math)."""
    if target.is_gpu or not scalar_call(node, target.isa):
        return 0.0
    return SCALAR_FLOPS[node.op] * max(target.simd_lanes, 1)
