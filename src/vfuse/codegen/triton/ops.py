"""What each IR op becomes in Triton: an expression over its arguments' compute values.

Float math without a `tl` builtin calls a prelude helper (`prelude.py`); those are fp32
approximations, so fp64 graphs using them are refused (`TritonUnsupported`) rather than
computed at fp32 accuracy. Integer `//`, `%` and fmod go through helpers that never divide
by 0 or overflow on INT_MIN / -1; the writer records a zero divisor as a fault.
"""

from __future__ import annotations

from vfuse.codegen.triton.names import COMPUTE
from vfuse.errors import VfuseError
from vfuse.ir import DType, Op
from vfuse.ir.defs.pointwise import INT_DIVISION
from vfuse.schedule.kernel import Compute


class TritonUnsupported(VfuseError):
    """A kernel the Triton renderer cannot express (an op, a dtype); names the kernel and why."""


# Builtins, exact enough for every float compute type (fp32 and fp64).
FLOAT_BUILTIN: dict[Op, str] = {
    Op.EXP: "tl.exp({0})",
    Op.EXP2: "tl.exp2({0})",
    Op.LOG: "tl.log({0})",
    Op.LOG2: "tl.log2({0})",
    Op.SQRT: "tl.sqrt_rn({0})",
    Op.RSQRT: "(1.0 / tl.sqrt_rn({0}))",
    Op.SIN: "tl.sin({0})",
    Op.COS: "tl.cos({0})",
    Op.FLOOR: "tl.floor({0})",
    Op.CEIL: "tl.ceil({0})",
    Op.RECIPROCAL: "(1.0 / {0})",
    Op.TAN: "(tl.sin({0}) / tl.cos({0}))",
    Op.LOG10: "(tl.log({0}) * 0.4342944819032518)",
}
# fp32 helpers of the prelude (fp16/bf16 compute in fp32).
FLOAT_HELPER: dict[Op, str] = {
    Op.EXPM1: "_vf_expm1({0})",
    Op.LOG1P: "_vf_log1p({0})",
    Op.TANH: "_vf_tanh({0})",
    Op.ERF: "_vf_erf({0})",
    Op.ERFC: "(1.0 - _vf_erf({0}))",
    Op.SIGMOID: "_vf_sigmoid({0})",
    Op.SILU: "_vf_silu({0})",
    Op.ROUND: "_vf_round({0})",
    Op.TRUNC: "_vf_trunc({0})",
    Op.ATAN: "_vf_atan({0})",
    Op.ASIN: "_vf_asin({0})",
    Op.ACOS: "_vf_acos({0})",
    Op.SINH: "_vf_sinh({0})",
    Op.COSH: "_vf_cosh({0})",
    Op.ASINH: "_vf_asinh({0})",
    Op.ACOSH: "_vf_acosh({0})",
    Op.ATANH: "_vf_atanh({0})",
    Op.POW: "_vf_pow({0}, {1})",
    Op.ATAN2: "_vf_atan2({0}, {1})",
    Op.FLOOR_DIV: "_vf_floordiv_f({0}, {1})",
    Op.REMAINDER: "_vf_remainder_f({0}, {1})",
}
ANY_DTYPE: dict[Op, str] = {
    Op.ABS: "tl.abs({0})",
    Op.RELU: "tl.where({0} < 0, 0, {0})",
    Op.ADD: "({0} + {1})",
    Op.SUB: "({0} - {1})",
    Op.MUL: "({0} * {1})",
    Op.EQ: "({0} == {1})",
    Op.NE: "({0} != {1})",
    Op.LT: "({0} < {1})",
    Op.LE: "({0} <= {1})",
    Op.GT: "({0} > {1})",
    Op.GE: "({0} >= {1})",
    Op.WHERE: "tl.where({0}, {1}, {2})",
    Op.LOGICAL_NOT: "({0} == 0)",
    Op.LOGICAL_AND: "(({0} != 0) & ({1} != 0))",
    Op.LOGICAL_OR: "(({0} != 0) | ({1} != 0))",
    Op.LOGICAL_XOR: "(({0} != 0) ^ ({1} != 0))",
    Op.ISNAN: "({0} != {0})",
    Op.BITWISE_AND: "({0} & {1})",
    Op.BITWISE_OR: "({0} | {1})",
    Op.BITWISE_XOR: "({0} ^ {1})",
}
INT_HELPER: dict[Op, str] = {
    Op.FLOOR_DIV: "_vf_floordiv_i({0}, {1})",
    Op.REMAINDER: "_vf_remainder_i({0}, {1})",
    Op.FMOD: "_vf_fmod_i({0}, {1})",
}


def is_fault_site(s: Compute) -> bool:
    """An integer division: a zero divisor is recorded as a fault."""
    return s.op in INT_DIVISION and not s.dtype.is_float


def compute(s: Compute, args: tuple[str, ...], where: str) -> str:
    """The expression of `s` (`where` names the kernel in errors)."""
    src = s.arg_dtypes[0] if s.arg_dtypes else s.dtype
    if s.op is Op.CAST:
        return cast(args[0], src, s.dtype)
    if s.op is Op.EMBEDDING:  # a gather index that wraps: negative indices count from the end
        i = f"{args[0]}.to(tl.int64)"
        return f"tl.where({i} < 0, {i} + {s.attrs['rows']}, {i})"
    if s.op is Op.GELU:
        helper = "_vf_gelu_tanh" if s.attrs["approximate"] == "tanh" else "_vf_gelu"
        return _float_helper(s, f"{helper}({{0}})", args, where)
    special = _by_dtype(s, src, args)
    if special is not None:
        return special
    if s.op in ANY_DTYPE:
        return ANY_DTYPE[s.op].format(*args)
    if src.is_float and s.op in FLOAT_BUILTIN:
        return FLOAT_BUILTIN[s.op].format(*args)
    if src.is_float and s.op in FLOAT_HELPER:
        return _float_helper(s, FLOAT_HELPER[s.op], args, where)
    if not src.is_float and s.op in INT_HELPER:
        return INT_HELPER[s.op].format(*args)
    raise TritonUnsupported(f"{where}: {s.op.value} on {src.value} has no Triton rendering yet")


def _by_dtype(s: Compute, src: DType, args: tuple[str, ...]) -> str | None:
    """Ops whose spelling depends on the dtype (NaN-propagating max/min, sign, ...)."""
    a = args[0]
    if s.op in (Op.MAXIMUM, Op.MINIMUM):
        fn = "tl.maximum" if s.op is Op.MAXIMUM else "tl.minimum"
        if src is DType.BOOL:
            return f"({a} | {args[1]})" if s.op is Op.MAXIMUM else f"({a} & {args[1]})"
        return f"{fn}({a}, {args[1]}, propagate_nan=tl.PropagateNan.ALL)" if src.is_float else f"{fn}({a}, {args[1]})"
    if s.op is Op.DIV:
        return f"tl.div_rn({a}, {args[1]})" if COMPUTE[src] == "tl.float32" else f"({a} / {args[1]})"
    if s.op is Op.FMOD and src.is_float:
        return f"({a} % {args[1]})"
    if s.op is Op.SIGN:
        # (x > 0) - (x < 0), as torch: sign(-0.0) and sign(NaN) are +0.
        return f"(({a} > 0).to({COMPUTE[src]}) - ({a} < 0).to({COMPUTE[src]}))"
    if s.op is Op.NEG:  # triton's -x is 0 - x: +0 for x = +0, where torch gives -0
        return f"({a} * -1.0)" if src.is_float else f"(-{a})"
    if s.op is Op.BITWISE_NOT:
        return f"({a} == 0)" if src is DType.BOOL else f"(~{a})"
    if s.op is Op.ISINF:
        return f"(tl.abs({a}) == float('inf'))" if src.is_float else f"({a} != {a})"
    return None


def _float_helper(s: Compute, rule: str, args: tuple[str, ...], where: str) -> str:
    if s.dtype is DType.F64 or DType.F64 in s.arg_dtypes:
        raise TritonUnsupported(f"{where}: fp64 {s.op.value} (the Triton helpers are fp32 approximations)")
    return rule.format(*args)


def cast(x: str, src: DType, dst: DType) -> str:
    """A cast between compute values: fp16/bf16 targets are rounded as torch rounds (and a cast
    out of fp16/bf16 arithmetic sees the rounded value); bool is x != 0."""
    if src is dst:
        return x
    if src in (DType.F16, DType.BF16):
        x = round_to(x, src)
    if dst is DType.BOOL:
        return f"({x} != 0)"
    if dst.is_fp8:  # torch rounds to fp8 (schedule/fp8dot.py keeps those casts there)
        raise TritonUnsupported(f"cast to {dst.value}")
    if dst in (DType.F16, DType.BF16):
        return round_to(f"{x}.to(tl.float32)", dst)
    return f"{x}.to({COMPUTE[dst]})"


def round_to(x: str, dtype: DType) -> str:
    """An fp32 compute value rounded to fp16 / bf16 (kept in fp32)."""
    return f"_vf_round_h({x})" if dtype is DType.F16 else f"_vf_round_bf({x})"
