"""Primitive ops as an enum, op kinds as a lattice, and the OpDef record each op is defined by.

Each op is registered exactly once (in `vfuse/ir/defs/`; looked up through `vfuse.ir.opdefs`) as
an `OpDef`: its kind, arity, required attributes, type rule, reference semantics and flop count.
The interpreter, the cost model and every code generator read that one definition; backends key
their own tables by `Op`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from vfuse.ir.types import TensorType, Type


class Kind(enum.IntEnum):
    """Op kinds ordered as a lattice (TVM's vocabulary); SOURCE marks graph inputs/constants.

    Legality rules compare kinds: a lower kind can always be fused into a group whose
    dominant kind is higher, subject to the rules in `vfuse.fusion.legality`.
    """

    SOURCE = 0
    ELEMENTWISE = 1
    BROADCAST = 2
    INJECTIVE = 3
    REDUCE = 4
    CONTRACTION = 5
    OPAQUE = 6


class Op(enum.Enum):
    """Every primitive op of the IR. Values are the printed names."""

    # sources
    INPUT = "input"
    CONSTANT = "constant"
    FULL = "full"
    IOTA = "iota"
    RNG_SEED = "rng_seed"
    # unary pointwise
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ERF = "erf"
    ERFC = "erfc"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SIGN = "sign"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"
    ISNAN = "isnan"
    ISINF = "isinf"
    CAST = "cast"
    # binary pointwise (inputs broadcast, share one dtype)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    FLOOR_DIV = "floor_div"
    REMAINDER = "remainder"
    FMOD = "fmod"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    ATAN2 = "atan2"
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
    # ternary / random pointwise
    WHERE = "where"
    RAND = "rand"
    # reductions
    SUM = "sum"
    PROD = "prod"
    AMAX = "amax"
    AMIN = "amin"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    ANY = "any"
    ALL = "all"
    # layout
    RESHAPE = "reshape"
    PERMUTE = "permute"
    EXPAND = "expand"
    SLICE = "slice"
    CAT = "cat"
    EMBEDDING = "embedding"
    # contractions
    MATMUL = "matmul"
    CONV2D = "conv2d"
    SDPA = "sdpa"
    SDPA_LSE = "sdpa_lse"  # training forward: output and logsumexp, one flat tensor
    SDPA_BACKWARD = "sdpa_backward"  # dq, dk, dv as one flat tensor
    SCATTER_ADD = "scatter_add"  # out[b, index[b, n]] += values[b, n], n in order (ir/defs/scatter.py)
    # torch fallback
    OPAQUE = "opaque"
    GET_ITEM = "get_item"

    def __repr__(self) -> str:
        return f"Op.{self.name}"


@dataclass(frozen=True, slots=True)
class Attrs(Mapping[str, Any]):
    """Immutable, hashable node attributes (sorted key/value pairs)."""

    items_: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(**kwargs: Any) -> Attrs:
        return Attrs(tuple(sorted(kwargs.items())))

    def __getitem__(self, key: str) -> Any:
        for k, v in self.items_:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def replace(self, **kwargs: Any) -> Attrs:
        return Attrs.of(**{**dict(self.items_), **kwargs})


@dataclass(frozen=True, eq=False, slots=True)
class ConstValue:
    """A constant tensor held by a CONSTANT node; compared by identity, never mutated."""

    tensor: torch.Tensor

    def __str__(self) -> str:
        return f"<{TensorType.of(self.tensor)}>"


InferFn = Callable[[tuple[TensorType, ...], Attrs], Type]
RefFn = Callable[..., Any]
FlopsFn = Callable[[tuple[TensorType, ...], Type, Attrs], int]


def _default_bytes(ins: tuple[TensorType, ...], out: Type, attrs: Attrs) -> int:
    """Unfused DRAM traffic: read every input once, write the output once."""
    return sum(t.nbytes for t in ins) + out.nbytes


@dataclass(frozen=True)
class OpDef:
    """The single definition of an op, read by every stage.

    `ref(*tensors, attrs)` is the reference semantics; `infer(types, attrs)` the type rule;
    `flops` and `bytes` feed the cost model (bytes = unfused DRAM traffic of the op alone).
    `arity` None means variadic. Facts the passes and backends ask about:
    `pure`: same inputs give the same output (CSE may merge it, constant folding evaluate it);
    `layout_only`: the output's elements are input elements moved (an index map in a consumer);
    `returns_index`: a reduction whose result is the position of its winner (argmax/argmin);
    `matrix_unit`: a contraction whose flops run at the matrix (FMA/tensor-core) rate; False for
    one that only adds (scatter-add), priced at the vector rate.
    """

    op: Op
    kind: Kind
    arity: int | None
    infer: InferFn
    ref: RefFn
    flops: FlopsFn
    attrs: tuple[str, ...] = ()
    bytes: FlopsFn = _default_bytes
    doc: str = ""
    pure: bool = True
    layout_only: bool = False
    returns_index: bool = False
    matrix_unit: bool = True


REGISTRY: dict[Op, OpDef] = {}


def register(d: OpDef) -> OpDef:
    if d.op in REGISTRY:
        raise ValueError(f"{d.op} is defined twice")
    REGISTRY[d.op] = d
    return d
