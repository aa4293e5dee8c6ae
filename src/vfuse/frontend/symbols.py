"""Dynamo's / export's symbolic sizes as vfuse `SymSize`s (ir/sym.py).

A graph traced with dynamic shapes carries torch SymInts: in its placeholders' FakeTensor
shapes, as SymInt placeholders (`s0: Sym(s0)`), and as size arguments computed by `sym_size`
/ arithmetic nodes. `sym_env(gm)` makes the compilation's SymEnv from the placeholders (each
symbol's hint and value range from Dynamo's ShapeEnv); `to_size` turns a SymInt into a SymSize
over it without ever asking torch for its value (which would add a guard to Dynamo's ShapeEnv,
one a lazily compiled backward could not install). `bindings` says where each symbol's value
is read from a call's arguments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.frontend.errors import LoweringError
from vfuse.ir.sym import SymEnv

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass(frozen=True, slots=True)
class Binding:
    """Symbol `symbol` is argument `index`'s size at `dim` (None: the argument is the int)."""

    symbol: sympy.Symbol
    index: int
    dim: int | None


def placeholder_values(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def is_symbolic(v: Any) -> bool:
    if isinstance(v, SYMBOLIC):
        return True
    return isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)


def bindings(values: list[Any]) -> list[Binding]:
    """Where each symbol of the placeholders is read: the first bare occurrence."""
    out: dict[sympy.Symbol, Binding] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            out.setdefault(v.node.expr, Binding(v.node.expr, i, None))
        elif isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    out.setdefault(size.node.expr, Binding(size.node.expr, i, d))
    return list(out.values())


def sym_env(gm: torch.fx.GraphModule, args: Sequence[Any] | None = None) -> SymEnv | None:
    """The SymEnv of a graph whose placeholders have symbolic sizes (None: all concrete), with
    the sizes of the call `args` as hints (default: the traced example's). Every symbol must be
    readable from the arguments (bare somewhere), else this graph stays specialized."""
    values = placeholder_values(gm)
    if not any(is_symbolic(v) for v in values):
        return None
    found: dict[sympy.Symbol, tuple[int, ValueRanges]] = {}
    for b in bindings(values):
        v = values[b.index]
        node = (v if b.dim is None else v.shape[b.dim]).node
        hint = node.shape_env.backed_var_to_val[b.symbol]
        if args is not None:
            hint = args[b.index] if b.dim is None else args[b.index].shape[b.dim]
        found[b.symbol] = (int(hint), _range(node.shape_env, b.symbol))
    env = SymEnv(found)
    env.arguments = {b.symbol.name: b.index for b in bindings(values) if b.dim is None}
    for v in values:
        for d in _sizes_of(v):
            missing = d.node.expr.free_symbols - set(found)
            if missing:
                raise LoweringError(None, f"size {d} uses symbols {sorted(map(str, missing))} no input gives")
    return env


def _range(shape_env: Any, s: sympy.Symbol) -> ValueRanges:
    r = shape_env.var_to_range.get(s)
    lo = int(r.lower) if r is not None and r.lower.is_Integer else 0  # int_oo.is_finite is True
    hi = r.upper if r is not None else sympy.oo
    return ValueRanges(max(lo, 0), hi)


def _sizes_of(v: Any) -> list[Any]:
    if isinstance(v, torch.SymInt):
        return [v]
    if isinstance(v, torch.Tensor):
        return [d for d in v.shape if isinstance(d, torch.SymInt)]
    return []


def to_size(env: SymEnv | None, v: Any) -> Any:
    """A SymInt as a SymSize (an int stays an int); anything else unchanged."""
    if isinstance(v, torch.SymInt):
        if env is None:
            raise LoweringError(None, f"symbolic size {v} (shapes must be specialized before lowering)")
        expr = v.node.expr
        if not expr.free_symbols <= set(env.hints):
            raise LoweringError(None, f"size {expr} uses symbols no input gives (data-dependent)")
        return env.size(expr)
    if isinstance(v, torch.SymFloat | torch.SymBool):
        raise LoweringError(None, f"symbolic scalar {v} is not supported")
    return v


def shape(env: SymEnv | None, v: torch.Tensor) -> tuple[Any, ...]:
    return tuple(to_size(env, d) for d in v.shape)


def sized_arg(env: SymEnv | None, a: Any) -> Any:
    """An FX argument with each SymInt-valued node (sym_size, size arithmetic) replaced by its SymSize."""
    if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), SYMBOLIC):
        return to_size(env, a.meta["val"])
    if isinstance(a, torch.SymInt):
        return to_size(env, a)
    return a


@contextlib.contextmanager
def sized_args(env: SymEnv | None, node: torch.fx.Node) -> Iterator[None]:
    """While lowering `node`, its size arguments read as SymSizes (restored afterwards)."""
    if env is None:
        yield
        return
    args, kwargs = node.args, node.kwargs
    new_args = map_aggregate(args, lambda a: sized_arg(env, a))
    new_kwargs = map_aggregate(kwargs, lambda a: sized_arg(env, a))
    changed = new_args != args or new_kwargs != kwargs
    if changed:
        node.args, node.kwargs = new_args, new_kwargs  # type: ignore[assignment]
    try:
        yield
    finally:
        if changed:
            node.args, node.kwargs = args, kwargs


def is_size_node(node: torch.fx.Node) -> bool:
    """A node computing a size or asserting on sizes: no tensor work to lower."""
    return isinstance(node.meta.get("val"), SYMBOLIC) or node.target in _ASSERTS


def take_assert(env: SymEnv | None, node: torch.fx.Node) -> None:
    """A runtime assert on sizes (torch._check, a reshape's divisibility) as a guard of ours:
    sizes that break it are not served by this program."""
    cond = node.args[0] if node.args else None
    val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
    if env is None or not isinstance(val, torch.SymBool):
        return
    expr = val.node.expr
    if expr.free_symbols <= set(env.hints) and env._prove(expr) is not True:
        env.guard(expr)


_ASSERTS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default}
