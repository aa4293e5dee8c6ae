"""The ops a fuzz program can call, by kind, and `apply` that runs one step.

Each op is an enum member so a printed Program can be pasted back. Ops whose raw form has a
domain edge (log of a negative, 1/0) are written with a guard (log(|x| + 1)): the fuzzer looks
for wrong results, and a NaN that depends on a rounding error would only be noise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from tests.fuzz.program import Kind, Step, Sym


class U(Sym):
    """Unary pointwise ops."""

    NEG = "neg"
    ABS = "abs"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    ERF = "erf"
    ERFC = "erfc"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ATAN = "atan"
    ASIN = "asin"
    ACOS = "acos"
    ATANH = "atanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    SINH = "sinh"
    COSH = "cosh"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    LEAKY_RELU = "leaky_relu"
    HARDTANH = "hardtanh"
    ELU = "elu"
    SELU = "selu"
    SOFTPLUS = "softplus"
    MISH = "mish"
    HARDSWISH = "hardswish"
    HARDSIGMOID = "hardsigmoid"
    LOGSIGMOID = "logsigmoid"
    # Discontinuous: only applied to values that eager and vfuse compute bit-identically.
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SIGN = "sign"
    ISNAN = "isnan"
    ISINF = "isinf"
    ISFINITE = "isfinite"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"


UNARY_FNS: dict[U, Callable[[torch.Tensor], torch.Tensor]] = {
    U.NEG: torch.neg,
    U.ABS: torch.abs,
    U.RELU: torch.relu,
    U.SIGMOID: torch.sigmoid,
    U.TANH: torch.tanh,
    U.ERF: torch.erf,
    U.ERFC: torch.erfc,
    U.SIN: torch.sin,
    U.COS: torch.cos,
    U.TAN: lambda x: torch.tan(torch.tanh(x)),
    U.ATAN: torch.atan,
    U.ASIN: lambda x: torch.asin(torch.tanh(x) * 0.9),
    U.ACOS: lambda x: torch.acos(torch.tanh(x) * 0.9),
    U.ATANH: lambda x: torch.atanh(torch.tanh(x) * 0.9),
    U.ASINH: torch.asinh,
    U.ACOSH: lambda x: torch.acosh(x.abs() + 1.5),
    U.SINH: torch.sinh,
    U.COSH: torch.cosh,
    U.EXP: torch.exp,
    U.EXP2: torch.exp2,
    U.EXPM1: torch.expm1,
    U.LOG: lambda x: torch.log(x.abs() + 1),
    U.LOG2: lambda x: torch.log2(x.abs() + 0.5),
    U.LOG10: lambda x: torch.log10(x.abs() + 0.5),
    U.LOG1P: lambda x: torch.log1p(x.abs()),
    U.SQRT: lambda x: torch.sqrt(x.abs()),
    U.RSQRT: lambda x: torch.rsqrt(x.abs() + 0.25),
    U.RECIPROCAL: lambda x: torch.reciprocal(x.abs() + 0.25),
    U.GELU: F.gelu,
    U.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    U.SILU: F.silu,
    U.LEAKY_RELU: lambda x: F.leaky_relu(x, 0.1),
    U.HARDTANH: lambda x: F.hardtanh(x, -1.5, 0.5),
    U.ELU: F.elu,
    U.SELU: F.selu,
    U.SOFTPLUS: F.softplus,
    U.MISH: F.mish,
    U.HARDSWISH: F.hardswish,
    U.HARDSIGMOID: F.hardsigmoid,
    U.LOGSIGMOID: F.logsigmoid,
    U.FLOOR: torch.floor,
    U.CEIL: torch.ceil,
    U.ROUND: torch.round,
    U.TRUNC: torch.trunc,
    U.SIGN: torch.sign,
    U.ISNAN: torch.isnan,
    U.ISINF: torch.isinf,
    U.ISFINITE: torch.isfinite,
    U.LOGICAL_NOT: torch.logical_not,
    U.BITWISE_NOT: torch.bitwise_not,
}


class B(Sym):
    """Binary pointwise ops (operands broadcast; dtypes promote)."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    POW = "pow"
    ATAN2 = "atan2"
    FLOOR_DIV = "floor_div"
    REMAINDER = "remainder"
    FMOD = "fmod"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


def _nonzero(b: torch.Tensor) -> torch.Tensor:
    """A divisor that is never 0 (integers: |b| + 1 cannot wrap to 0, not even for INT_MIN)."""
    return b.abs() + 1 if not b.is_floating_point() else b.abs() + 0.5


BINARY_FNS: dict[B, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    B.ADD: torch.add,
    B.SUB: torch.sub,
    B.MUL: torch.mul,
    B.DIV: lambda a, b: a / _nonzero(b),
    B.MAXIMUM: torch.maximum,
    B.MINIMUM: torch.minimum,
    B.POW: lambda a, b: torch.pow(a.abs() + 0.5, torch.tanh(b)),
    B.ATAN2: torch.atan2,
    B.FLOOR_DIV: lambda a, b: torch.floor_divide(a, _nonzero(b)),
    B.REMAINDER: lambda a, b: torch.remainder(a, _nonzero(b)),
    B.FMOD: lambda a, b: torch.fmod(a, _nonzero(b)),
    B.BITWISE_AND: torch.bitwise_and,
    B.BITWISE_OR: torch.bitwise_or,
    B.BITWISE_XOR: torch.bitwise_xor,
    B.LOGICAL_AND: torch.logical_and,
    B.LOGICAL_OR: torch.logical_or,
    B.LOGICAL_XOR: torch.logical_xor,
    B.EQ: torch.eq,
    B.NE: torch.ne,
    B.LT: torch.lt,
    B.LE: torch.le,
    B.GT: torch.gt,
    B.GE: torch.ge,
}


class S(Sym):
    """Ops of a tensor and python scalars (params hold the scalars)."""

    ADD = "add"
    MUL = "mul"
    RSUB = "rsub"
    DIV = "div"
    POW = "pow"
    ABS_POW = "abs_pow"
    CLAMP = "clamp"
    CLAMP_MIN = "clamp_min"
    GT = "gt"
    EQ = "eq"
    FULL_LIKE = "full_like"
    ARANGE_ADD = "arange_add"
    TRIU = "triu"
    TRIL = "tril"


SCALAR_FNS: dict[S, Callable[..., torch.Tensor]] = {
    S.ADD: lambda x, s: x + s,
    S.MUL: lambda x, s: x * s,
    S.RSUB: lambda x, s: s - x,
    S.DIV: lambda x, s: x / s,
    S.POW: lambda x, s: x**s,
    S.ABS_POW: lambda x, s: (x.abs() + 0.5) ** s,
    S.CLAMP: lambda x, lo, hi: x.clamp(lo, hi),
    S.CLAMP_MIN: lambda x, lo: x.clamp_min(lo),
    S.GT: lambda x, s: x > s,
    S.EQ: lambda x, s: x == s,
    S.FULL_LIKE: lambda x, s: torch.full_like(x, s),
    S.ARANGE_ADD: lambda x, s: x + torch.arange(x.shape[-1], dtype=x.dtype) * s,
    S.TRIU: lambda x, k: x.triu(k),
    S.TRIL: lambda x, k: x.tril(k),
}


class R(Sym):
    """Reductions; params (dims or None, keepdim, extra)."""

    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    VAR = "var"
    STD = "std"
    PROD = "prod"
    LOGSUMEXP = "logsumexp"
    NORM2 = "norm2"
    ANY = "any"
    ALL = "all"


def _all_dims(x: torch.Tensor, dims: tuple[int, ...] | None) -> tuple[int, ...]:
    return tuple(range(x.dim())) if dims is None else dims


REDUCE_FNS: dict[R, Callable[..., torch.Tensor]] = {
    R.SUM: lambda x, d, k, e: x.sum(d, keepdim=k) if d is not None else x.sum(),
    R.MEAN: lambda x, d, k, e: x.mean(d, keepdim=k) if d is not None else x.mean(),
    R.AMAX: lambda x, d, k, e: x.amax(_all_dims(x, d), keepdim=k),
    R.AMIN: lambda x, d, k, e: x.amin(_all_dims(x, d), keepdim=k),
    R.VAR: lambda x, d, k, e: torch.var(x, d, correction=e, keepdim=k),
    R.STD: lambda x, d, k, e: torch.std(x, d, correction=e, keepdim=k),
    R.PROD: lambda x, d, k, e: x.prod(d[0], keepdim=k) if d is not None else x.prod(),
    R.LOGSUMEXP: lambda x, d, k, e: torch.logsumexp(x, _all_dims(x, d), keepdim=k),
    R.NORM2: lambda x, d, k, e: torch.linalg.vector_norm(x, 2, d, keepdim=k),
    R.ANY: lambda x, d, k, e: x.any(d[0], keepdim=k) if d is not None else x.any(),
    R.ALL: lambda x, d, k, e: x.all(d[0], keepdim=k) if d is not None else x.all(),
}


class A(Sym):
    """Index-returning reductions and max/min with indices; params (dim or None, keepdim)."""

    ARGMAX = "argmax"
    ARGMIN = "argmin"
    MAX_VALUES = "max_values"
    MAX_INDICES = "max_indices"
    MIN_VALUES = "min_values"


ARG_FNS: dict[A, Callable[..., torch.Tensor]] = {
    A.ARGMAX: lambda x, d, k: x.argmax(d, keepdim=k),
    A.ARGMIN: lambda x, d, k: x.argmin(d, keepdim=k),
    A.MAX_VALUES: lambda x, d, k: x.max(d, keepdim=k)[0] if d is not None else x.max(),
    A.MAX_INDICES: lambda x, d, k: x.max(d, keepdim=k)[1],
    A.MIN_VALUES: lambda x, d, k: x.min(d, keepdim=k)[0] if d is not None else x.min(),
}


class N(Sym):
    """Normalizations; srcs (x, weight?, bias?), params (n or groups, eps, has_weight, has_bias)."""

    LAYER = "layer_norm"
    RMS = "rms_norm"
    GROUP = "group_norm"
    BATCH_TRAIN = "batch_norm_train"
    BATCH_EVAL = "batch_norm_eval"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"


class P(Sym):
    """2-D pools of a 4-D value; params (kernel, stride, padding, dilation, ceil_mode)."""

    MAX = "max_pool2d"
    AVG = "avg_pool2d"


class G(Sym):
    """Gathers; srcs (table or x, index)."""

    EMBEDDING = "embedding"
    INDEX_SELECT = "index_select"
    INDEX = "index"
    TAKE_ALONG = "take_along"


class V(Sym):
    """Views and layout changes; params depend on the op."""

    RESHAPE = "reshape"
    PERMUTE = "permute"
    TRANSPOSE = "transpose"
    EXPAND = "expand"
    UNSQUEEZE = "unsqueeze"
    SQUEEZE = "squeeze"
    SLICE = "slice"
    SELECT = "select"
    FLATTEN = "flatten"
    CONTIGUOUS = "contiguous"
    PAD = "pad"


VIEW_FNS: dict[V, Callable[..., torch.Tensor]] = {
    V.RESHAPE: lambda x, shape: x.reshape(shape),
    V.PERMUTE: lambda x, perm: x.permute(perm),
    V.TRANSPOSE: lambda x, d0, d1: x.transpose(d0, d1),
    V.EXPAND: lambda x, shape: x.expand(shape),
    V.UNSQUEEZE: lambda x, d: x.unsqueeze(d),
    V.SQUEEZE: lambda x, d: x.squeeze(d),
    V.SLICE: lambda x, d, start, stop, step: x[(slice(None),) * d + (slice(start, stop, step),)],
    V.SELECT: lambda x, d, i: x.select(d, i),
    V.FLATTEN: lambda x, start, end: x.flatten(start, end),
    V.CONTIGUOUS: lambda x: x.contiguous(),
    V.PAD: lambda x, pads, value: F.pad(x, pads, value=value),
}


def _norm(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    x, rest = values[step.srcs[0]], [values[i] for i in step.srcs[1:]]
    n, eps, has_w, has_b = step.params
    w = rest.pop(0) if has_w else None
    b = rest.pop(0) if has_b else None
    if step.fn is N.LAYER:
        return F.layer_norm(x, x.shape[-n:], w, b, eps)
    if step.fn is N.RMS:
        return F.rms_norm(x, x.shape[-n:], w, eps)
    if step.fn is N.GROUP:
        return F.group_norm(x, n, w, b, eps)
    if step.fn is N.BATCH_TRAIN:
        return F.batch_norm(x, None, None, w, b, training=True, eps=eps)
    if step.fn is N.BATCH_EVAL:
        mean, var = rest
        return F.batch_norm(x, mean, var, w, b, training=False, eps=eps)
    if step.fn is N.SOFTMAX:
        return torch.softmax(x, n)
    return torch.log_softmax(x, n)


def _gather(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    x, idx = values[step.srcs[0]], values[step.srcs[1]]
    if step.fn is G.EMBEDDING:
        return F.embedding(idx, x)
    if step.fn is G.INDEX_SELECT:
        return x.index_select(step.params[0], idx)
    if step.fn is G.INDEX:
        return x[idx]
    return torch.gather(x, step.params[0], idx)


def _linear(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    args = [values[i] for i in step.srcs]
    y = F.linear(*args)
    return F.gelu(y) if step.params[0] else y


def _conv(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    stride, padding, dilation, groups = step.params
    return F.conv2d(*(values[i] for i in step.srcs), stride=stride, padding=padding, dilation=dilation, groups=groups)


def _pool(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    x = values[step.srcs[0]]
    kernel, stride, padding, dilation, ceil_mode = step.params
    if step.fn is P.MAX:
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode)
    return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode)


def _sdpa(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    q, k, v, *mask = (values[i] for i in step.srcs)
    causal, scale = step.params
    if not torch.compiler.is_compiling():  # eager and the float64 reference: the definition (see below)
        return _attention_definition(q, k, v, mask[0] if mask else None, causal, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None, is_causal=causal, scale=scale)


def _attention_definition(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float | None
) -> torch.Tensor:
    """softmax(q k^T s + mask) v with masked keys left out, as the compiled graphs' SDPA must compute it. Eager's
    CPU flash kernel differs on NaN scores (0 in some columns of an all-NaN row), and the math backend adds the causal
    mask, so a NaN score it hides still makes its row NaN. A row with no key kept is 0, as in both."""
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        s = s + mask
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch._safe_softmax(s, -1) @ v


def apply(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    """Run one step on the values defined so far."""
    srcs = [values[i] for i in step.srcs]
    kind = step.kind
    if kind is Kind.UNARY:
        return UNARY_FNS[step.fn](srcs[0])
    if kind is Kind.BINARY:
        return BINARY_FNS[step.fn](srcs[0], srcs[1])
    if kind is Kind.SCALAR:
        return SCALAR_FNS[step.fn](srcs[0], *step.params)
    if kind is Kind.CAST:
        return srcs[0].to(step.params[0])
    if kind is Kind.WHERE:
        b = srcs[2] if len(srcs) == 3 else step.params[0]
        return torch.where(srcs[0], srcs[1], b)
    if kind is Kind.REDUCE:
        return REDUCE_FNS[step.fn](srcs[0], *step.params)
    if kind is Kind.ARG:
        return ARG_FNS[step.fn](srcs[0], *step.params)
    if kind is Kind.NORM:
        return _norm(step, values)
    if kind is Kind.MATMUL:
        return torch.matmul(srcs[0], srcs[1])
    if kind is Kind.LINEAR:
        return _linear(step, values)
    if kind is Kind.CONV:
        return _conv(step, values)
    if kind is Kind.POOL:
        return _pool(step, values)
    if kind is Kind.SDPA:
        return _sdpa(step, values)
    if kind is Kind.GATHER:
        return _gather(step, values)
    if kind is Kind.DROPOUT:
        return F.dropout(srcs[0], 0.0, training=True)
    if kind is Kind.VIEW:
        return VIEW_FNS[step.fn](srcs[0], *step.params)
    if kind is Kind.CAT:
        return torch.cat(srcs, step.params[0])
    raise ValueError(f"unknown step kind {kind}")
