"""Dynamo's / export's symbolic sizes as vfuse `SymSize`s (ir/sym.py).

A graph traced with dynamic shapes carries torch SymInts: in its placeholders' FakeTensor
shapes, as SymInt placeholders (`s0: Sym(s0)`), and as size arguments computed by `sym_size`
/ arithmetic nodes. `sym_env(gm)` makes the compilation's SymEnv from the placeholders (each
symbol's hint and value range from Dynamo's ShapeEnv); `to_size` turns a SymInt into a SymSize
over it without ever asking torch for its value (which would add a guard to Dynamo's ShapeEnv,
one a lazily compiled backward could not install), and a SymFloat computed from sizes (the
2.0 / (N - 1) of a variance's backward) into a `SymScalar` the emitter computes at run time.
`bindings` says where each symbol's value is read from a call's arguments.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.utils._sympy.functions import FloatPow, FloatTrueDiv, IntTrueDiv, ToFloat
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.frontend.errors import LoweringError
from vfuse.ir.sym import SymEnv, cpp, is_sym, python

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
    if isinstance(v, torch.SymFloat):
        return sym_scalar(env, v.node.expr)
    if isinstance(v, torch.SymBool):
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


@dataclass(frozen=True, slots=True)
class SymScalar:
    """A float computed from the sizes: a SymFloat over the symbols (`FloatTrueDiv(2.0,
    ToFloat(s0) - 1.0)`). Where a lowering takes it as an operand (`Emitter.scalar`) it becomes
    IR arithmetic in f64 over FULLs of the sizes, as Python computed it: read at run time, no
    guard. A lowering that needs its value (`float(v)`) gets it at the hint, each symbol it
    reads guarded equal to its hint (the program is then specialized, never wrong)."""

    expr: sympy.Basic
    env: SymEnv

    def walk(self, how: ScalarOps) -> Any:
        return _walk(self.expr, how)

    def __float__(self) -> float:
        for s in sorted(self.expr.free_symbols, key=lambda s: s.name):
            self.env.specialize(s)
        return float(self.walk(_Evaluate(self.env.hints)))

    def __neg__(self) -> SymScalar:
        return SymScalar(-self.expr, self.env)

    def __rmul__(self, v: float) -> SymScalar:
        """`v * self` for a Python float `v` (a BatchNorm's momentum times its n / (n - 1))."""
        return SymScalar(sympy.Float(v) * self.expr, self.env)


def size_ratio(env: SymEnv | None, n: Any, d: Any) -> Any:
    """n / d of two sizes as Python divides them: a float at fixed sizes, else a SymScalar (read at
    run time, no guard; `n / d` on a SymSize would specialize on both)."""
    if not is_sym(n) and not is_sym(d):
        return n / d
    return sym_scalar(env, FloatTrueDiv(ToFloat(sympy.sympify(_expr_of(n))), ToFloat(sympy.sympify(_expr_of(d)))))


def _expr_of(v: Any) -> Any:
    return v.expr if is_sym(v) else v

    def __str__(self) -> str:
        return str(self.expr)


def sym_scalar(env: SymEnv | None, expr: sympy.Basic) -> Any:
    """A SymFloat's expression as a SymScalar (a float when it has no symbol); a LoweringError
    where it reads a symbol no input gives (data-dependent) or an operation the IR lacks."""
    if not expr.free_symbols:
        return float(expr)
    if env is None:
        raise LoweringError(None, f"symbolic scalar {expr} (shapes must be specialized before lowering)")
    if not expr.free_symbols <= set(env.hints):
        raise LoweringError(None, f"symbolic scalar {expr} uses symbols no input gives (data-dependent)")
    v = SymScalar(expr, env)
    v.walk(ScalarOps())  # every operation known (else a LoweringError now)
    return v


class ScalarOps:
    """What `_walk` builds a SymScalar's value with (a Python float, or IR nodes); this base
    builds nothing (a check that every operation is known)."""

    def number(self, v: float) -> Any:
        return None

    def size(self, e: sympy.Basic) -> Any:  # ToFloat of an integer size expression
        return None

    def binary(self, op: str, a: Any, b: Any) -> Any:  # op: add, mul, div, pow
        return None

    def unary(self, fn: str, a: Any) -> Any:  # fn: a math function's name (sqrt, exp, ...)
        return None


UNARY = ("sqrt", "exp", "log", "sin", "cos", "tan", "tanh")  # torch's OpaqueUnaryFn_<name> the IR has


def _walk(e: sympy.Basic, how: ScalarOps) -> Any:
    """Fold a SymFloat expression with `how`, in Python's order of operations where sympy keeps it."""
    if e.is_Number:
        return how.number(float(e))
    if isinstance(e, ToFloat):
        return how.size(_int_size(e.args[0]))
    if isinstance(e, IntTrueDiv):
        return how.binary("div", how.size(_int_size(e.args[0])), how.size(_int_size(e.args[1])))
    if isinstance(e, FloatTrueDiv | FloatPow):
        a, b = (_walk(x, how) for x in e.args)
        return how.binary("div" if isinstance(e, FloatTrueDiv) else "pow", a, b)
    if e.is_Add or e.is_Mul:
        parts = [_walk(x, how) for x in e.args]
        out = parts[0]
        for p in parts[1:]:
            out = how.binary("add" if e.is_Add else "mul", out, p)
        return out
    if e.is_Pow and e.exp.is_Integer and int(e.exp) == -1:  # sympy's x**-1 for a division
        return how.binary("div", how.number(1.0), _walk(e.base, how))
    if e.is_Pow:
        return how.binary("pow", _walk(e.base, how), _walk(e.exp, how))
    name = type(e).__name__.removeprefix("OpaqueUnaryFn_")
    if name in UNARY and len(e.args) == 1:
        return how.unary(name, _walk(e.args[0], how))
    raise LoweringError(None, f"symbolic scalar {e} ({type(e).__name__}) is not supported")


def _int_size(e: sympy.Basic) -> sympy.Basic:
    """An integer size expression the kernels and the runtime can print (else a LoweringError)."""
    try:
        cpp(e), python(e)
    except TypeError as err:
        raise LoweringError(None, f"symbolic scalar over {e}: {err}") from None
    return e


class _Evaluate(ScalarOps):
    """Python floats at the symbol values `at` (the hint: `float(SymScalar)`)."""

    _BINARY: dict[str, Callable[[float, float], float]] = {
        "add": float.__add__,
        "mul": float.__mul__,
        "div": lambda a, b: a / b if b else math.copysign(math.inf, a) if a else math.nan,
        "pow": float.__pow__,
    }

    def __init__(self, at: dict[sympy.Symbol, int]) -> None:
        self.at = at

    def number(self, v: float) -> float:
        return v

    def size(self, e: sympy.Basic) -> float:
        return float(int(e.xreplace(self.at)))

    def binary(self, op: str, a: float, b: float) -> float:
        return self._BINARY[op](a, b)

    def unary(self, fn: str, a: float) -> float:
        return float(getattr(math, fn)(a))
