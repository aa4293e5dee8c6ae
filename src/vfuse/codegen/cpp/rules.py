"""The C++ backend's tables, keyed by Op and DType: what each op and type becomes in C++.

Templates take operands as {0}, {1}, {2}, the compute type as {T} and node attributes by
name. Helpers named vf_* live in the prelude (`prelude.py`), overloaded per type so one
template serves float and integer dtypes. fp16/bf16 are stored as uint16_t and computed in
float; every other dtype computes in its own C++ type (integer wrap-around matches torch).
"""

from __future__ import annotations

from vfuse.ir import DType, Op

STORAGE_TYPE: dict[DType, str] = {
    DType.F32: "float",
    DType.F64: "double",
    DType.F16: "uint16_t",
    DType.BF16: "uint16_t",
    # fp8: never rendered in C++ (schedule/fp8dot.py keeps every group touching fp8 in torch on
    # CPU targets); the bytes' type, so a buffer of them could still be named.
    DType.F8E4M3: "uint8_t",
    DType.F8E5M2: "uint8_t",
    DType.I8: "int8_t",
    DType.U8: "uint8_t",
    DType.I16: "int16_t",
    DType.I32: "int32_t",
    DType.I64: "int64_t",
    DType.BOOL: "bool",
}

COMPUTE_TYPE: dict[DType, str] = {
    **STORAGE_TYPE,
    **{d: "float" for d in (DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2)},
}

# Storage -> compute conversion on load, and back on store ({0} is the value).
LOAD_CONVERT: dict[DType, str] = {DType.F16: "vf_h2f({0})", DType.BF16: "vf_bf2f({0})"}
STORE_CONVERT: dict[DType, str] = {DType.F16: "vf_f2h({0})", DType.BF16: "vf_f2bf({0})"}

CPP_RULES: dict[Op, str] = {
    # unary
    Op.NEG: "(-{0})",
    Op.ABS: "vf_abs({0})",
    Op.EXP: "vf_exp({0})",
    Op.EXP2: "vf_exp2({0})",
    Op.EXPM1: "vf_expm1({0})",
    Op.LOG: "vf_log({0})",
    Op.LOG2: "vf_log2({0})",
    Op.LOG10: "vf_log10({0})",
    Op.LOG1P: "vf_log1p({0})",
    Op.SQRT: "std::sqrt({0})",
    Op.RSQRT: "vf_rsqrt({0})",
    Op.SIN: "std::sin({0})",
    Op.COS: "std::cos({0})",
    Op.TAN: "std::tan({0})",
    Op.ASIN: "std::asin({0})",
    Op.ACOS: "std::acos({0})",
    Op.ATAN: "std::atan({0})",
    Op.SINH: "vf_sinh({0})",
    Op.COSH: "vf_cosh({0})",
    Op.TANH: "vf_tanh({0})",
    Op.ASINH: "std::asinh({0})",
    Op.ACOSH: "std::acosh({0})",
    Op.ATANH: "std::atanh({0})",
    Op.ERF: "vf_erf({0})",
    Op.ERFC: "std::erfc({0})",
    Op.SIGMOID: "vf_sigmoid({0})",
    Op.RELU: "vf_relu({0})",
    Op.GELU: "vf_gelu_{approximate}({0})",
    Op.SILU: "vf_silu({0})",
    Op.RECIPROCAL: "vf_recip({0})",
    Op.FLOOR: "std::floor({0})",
    Op.CEIL: "std::ceil({0})",
    Op.ROUND: "std::nearbyint({0})",
    Op.TRUNC: "std::trunc({0})",
    Op.SIGN: "vf_sign({0})",
    Op.LOGICAL_NOT: "(!{0})",
    Op.BITWISE_NOT: "vf_bnot({0})",
    Op.ISNAN: "({0} != {0})",
    Op.ISINF: "vf_isinf({0})",
    Op.CAST: "vf_cast<{T}>({0})",
    # binary
    Op.ADD: "({0} + {1})",
    Op.SUB: "({0} - {1})",
    Op.MUL: "({0} * {1})",
    Op.DIV: "({0} / {1})",
    Op.FLOOR_DIV: "vf_floordiv({0}, {1})",
    Op.REMAINDER: "vf_remainder({0}, {1})",
    Op.FMOD: "vf_fmod({0}, {1})",
    Op.POW: "vf_pow({0}, {1})",
    Op.MAXIMUM: "vf_max({0}, {1})",
    Op.MINIMUM: "vf_min({0}, {1})",
    Op.ATAN2: "std::atan2({0}, {1})",
    Op.BITWISE_AND: "({0} & {1})",
    Op.BITWISE_OR: "({0} | {1})",
    Op.BITWISE_XOR: "({0} ^ {1})",
    Op.LOGICAL_AND: "((bool){0} && (bool){1})",
    Op.LOGICAL_OR: "((bool){0} || (bool){1})",
    Op.LOGICAL_XOR: "((bool){0} != (bool){1})",
    Op.EQ: "({0} == {1})",
    Op.NE: "({0} != {1})",
    Op.LT: "({0} < {1})",
    Op.LE: "({0} <= {1})",
    Op.GT: "({0} > {1})",
    Op.GE: "({0} >= {1})",
    # ternary
    Op.WHERE: "({0} ? {1} : {2})",
    # the row of a gather whose negative indices count from the end (checked before the loops)
    Op.EMBEDDING: "vf_wrap_row({0}, {rows})",
}

# Integer division reports division by zero: {fault} is the kernel's fault record (or nullptr
# where no division can be by zero), {node} the IR node as a C string (faults.py).
FAULT_RULES: dict[Op, str] = {
    Op.FLOOR_DIV: "vf_ifloordiv({0}, {1}, {fault}, {node})",
    Op.REMAINDER: "vf_iremainder({0}, {1}, {fault}, {node})",
    Op.FMOD: "vf_ifmod({0}, {1}, {fault}, {node})",
}

# Reductions: accumulator init, per-element update, OpenMP reduction identifier (None: the
# loop is not a SIMD reduction) and how two partial accumulators combine.
REDUCE_RULES: dict[Op, tuple[str, str, str | None, str]] = {
    Op.SUM: ("({T})0", "{acc} += {x};", "+", "{acc} += {part};"),
    Op.PROD: ("({T})1", "{acc} *= {x};", "*", "{acc} *= {part};"),
    Op.AMAX: (
        "vf_lowest<{T}>()",
        "{acc} = {acc} < {x} ? {x} : {acc};",
        "max",
        "{acc} = {acc} < {part} ? {part} : {acc};",
    ),
    Op.AMIN: (
        "vf_highest<{T}>()",
        "{acc} = {acc} > {x} ? {x} : {acc};",
        "min",
        "{acc} = {acc} > {part} ? {part} : {acc};",
    ),
    Op.ANY: ("false", "{acc} = {acc} || ({x} != 0);", "||", "{acc} = {acc} || {part};"),
    Op.ALL: ("true", "{acc} = {acc} && ({x} != 0);", "&&", "{acc} = {acc} && {part};"),
    Op.ARGMAX: (
        "vf_lowest<{T}>()",
        "if ({x} > {acc} || ({x} != {x} && {acc} == {acc})) {{ {acc} = {x}; {idx} = {r}; }}",
        None,
        "",
    ),
    Op.ARGMIN: (
        "vf_highest<{T}>()",
        "if ({x} < {acc} || ({x} != {x} && {acc} == {acc})) {{ {acc} = {x}; {idx} = {r}; }}",
        None,
        "",
    ),
}
