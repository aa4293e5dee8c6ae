"""A fuzz program: a straight-line list of torch calls over graph inputs, printable as Python.

`Program` is data (frozen dataclasses and enums), so a shrunk counterexample prints as an
expression that a regression test can paste back. `build(program)` turns it into a plain torch
function, which is what Dynamo and torch.export capture; `make_inputs` makes its input tensors
(non-contiguous layouts, aliased inputs, index ranges, NaN/inf) from a seed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class Sym(enum.Enum):
    """An enum that prints as the Python expression naming it (programs print as pasteable code)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


def _fields_repr(obj: Any, defaults: dict[str, Any]) -> str:
    """`Name(field=value, ...)` leaving out fields at their default."""
    shown = (f"{k}={getattr(obj, k)!r}" for k in obj.__dataclass_fields__ if getattr(obj, k) != defaults.get(k, ...))
    return f"{type(obj).__name__}({', '.join(shown)})"


class Layout(Sym):
    """How an input tensor is laid out in memory (the values are the same)."""

    CONTIGUOUS = "contiguous"
    TRANSPOSED = "transposed"  # last two dims swapped in memory
    SLICED = "sliced"  # every other element of a wider buffer along the last dim
    EXPANDED = "expanded"  # size-1 storage along dim 0, broadcast with stride 0


class Values(Sym):
    """What values an input holds."""

    NORMAL = "normal"  # floats: randn clamped to [-4, 4]; integers: [low, high)
    SPECIAL = "special"  # NORMAL with NaN, +inf, -inf and -0.0 sprinkled in
    POSITIVE = "positive"  # floats in [0.5, 4.5] (variances)
    ROW_MASK = "row_mask"  # bool, every row (last dim) has at least one True (attention masks)


class Kind(Sym):
    INPUT = "input"
    UNARY = "unary"
    BINARY = "binary"
    SCALAR = "scalar"
    CAST = "cast"
    WHERE = "where"
    REDUCE = "reduce"
    ARG = "arg"
    NORM = "norm"
    MATMUL = "matmul"
    LINEAR = "linear"
    CONV = "conv"
    POOL = "pool"
    SDPA = "sdpa"
    GATHER = "gather"
    DROPOUT = "dropout"
    VIEW = "view"
    CAT = "cat"


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: Layout = Layout.CONTIGUOUS
    alias: int | None = None  # the same tensor object as input `alias`
    low: int | None = None  # integer inputs: values in [low, high)
    high: int | None = None
    values: Values = Values.NORMAL
    stat: bool = False  # a running statistic (BatchNorm's mean/var): never requires grad

    def __repr__(self) -> str:
        defaults = {"layout": Layout.CONTIGUOUS, "alias": None, "low": None, "high": None, "values": Values.NORMAL}
        return _fields_repr(self, {**defaults, "stat": False})


@dataclass(frozen=True)
class Step:
    kind: Kind
    fn: Any = None  # the member of the kind's enum (ops.UNARY_FNS keys, ...), or None
    srcs: tuple[int, ...] = ()  # indices of earlier values (every step defines one value)
    params: tuple = ()

    def __repr__(self) -> str:
        return _fields_repr(self, {"fn": None, "srcs": (), "params": ()})


@dataclass(frozen=True)
class Program:
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    seed: int = 0


def build(program: Program, apply: Callable[[Step, list[torch.Tensor]], torch.Tensor]) -> Callable:
    """The program as a torch function of its inputs, returning a tuple of its outputs."""
    steps = program.steps
    outputs = program.outputs

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: list[torch.Tensor] = []
        for step in steps:
            values.append(args[step.params[0]] if step.kind is Kind.INPUT else apply(step, values))
        return tuple(values[i] for i in outputs)

    return fn


def _values(spec: Input, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if spec.values is Values.ROW_MASK:
        mask = torch.randint(0, 2, shape, generator=gen).bool()
        if mask.numel():
            mask[..., 0] = True
        return mask
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not spec.dtype.is_floating_point:
        low = spec.low if spec.low is not None else -20
        high = spec.high if spec.high is not None else 21
        return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(spec.dtype)
    if spec.values is Values.POSITIVE:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * 4 + 0.5).to(spec.dtype)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).clamp(-4, 4)
    if spec.values is Values.SPECIAL and x.numel():
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (4,), generator=gen)
        for p, v in zip(picks.tolist(), (float("nan"), float("inf"), float("-inf"), -0.0)):
            flat[p] = v
    return x.to(spec.dtype)


def _leaf(spec: Input, gen: torch.Generator) -> torch.Tensor:
    """The tensor that holds an input's storage (gradients are taken w.r.t. it); see `_view_like`."""
    shape = spec.shape
    if spec.layout is Layout.TRANSPOSED and len(shape) >= 2:
        return _values(spec, (*shape[:-2], shape[-1], shape[-2]), gen)
    if spec.layout is Layout.SLICED and len(shape) >= 1:
        return _values(spec, (*shape[:-1], 2 * shape[-1] + 1), gen)
    if spec.layout is Layout.EXPANDED and len(shape) >= 1:
        return _values(spec, (1, *shape[1:]), gen)
    return _values(spec, shape, gen)


def make_inputs(
    program: Program, grad: bool = False, double: bool = False, perturb: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(leaves, inputs) from the program's seed. `double`: floats as float64 (the same values).
    `grad`: float leaves require grad (aliased inputs share their leaf). `perturb` k > 0: floats
    moved by a few ulps of their dtype, the k-th such set (how much the program amplifies
    rounding; see check.py)."""
    gen = torch.Generator().manual_seed(program.seed)
    noise = torch.Generator().manual_seed(program.seed + 1 + int(perturb))
    leaves: list[torch.Tensor] = []
    inputs: list[torch.Tensor] = []
    for spec in program.inputs:
        if spec.alias is not None:
            inputs.append(inputs[spec.alias])
            continue
        leaf = _leaf(spec, gen)
        if perturb and leaf.is_floating_point() and not spec.stat:
            u = torch.rand(leaf.shape, generator=noise, dtype=torch.float64) * 2 - 1
            leaf = (leaf.double() * (1 + _nudge(leaf.dtype) * u)).to(leaf.dtype)
        if double and leaf.is_floating_point():
            leaf = leaf.double()
        if grad and leaf.is_floating_point() and not spec.stat:
            leaf.requires_grad_(True)
        leaves.append(leaf)
        inputs.append(_view_like(spec, leaf))
    return leaves, inputs


def _nudge(dtype: torch.dtype) -> float:
    """Relative size of the input nudge: 8 ulps in float32/64 (a sum's rounding is a few ulps of
    the sum, i.e. more than one of each element), one ulp in float16/bfloat16."""
    eps = torch.finfo(dtype).eps
    return eps if dtype in (torch.float16, torch.bfloat16) else 8 * eps


def _view_like(spec: Input, leaf: torch.Tensor) -> torch.Tensor:
    shape = spec.shape
    if spec.layout is Layout.TRANSPOSED and len(shape) >= 2:
        return leaf.transpose(-1, -2)
    if spec.layout is Layout.SLICED and len(shape) >= 1:
        return leaf[..., 1::2]
    if spec.layout is Layout.EXPANDED and len(shape) >= 1:
        return leaf.expand(shape)
    return leaf


def loss_weights(outputs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Fixed random weights for sum(output * weight), one per output (float64; cast by the caller)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outputs]
