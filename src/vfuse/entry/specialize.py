"""A graph with symbolic sizes, called with shapes a fixed-shape graph was compiled for, reuses it.

Dynamo compiles a frame for the shapes of its first call; on a second size it compiles it
again with symbolic sizes and from then on sends every call there, the first size included.
vfuse specializes symbolic graphs per concrete shape (tracing them again, tens of ms, then
compiling), so `B=8, 16, 8` would compile B=8 twice. `FixedGraphs` keeps every fixed-shape
graph with its compiled callable; before specializing, the symbolic graph is compared with
those of the same input signature, node by node, its size arithmetic evaluated at the call's
sizes. Only an exact match (same ops, same arguments, same outputs) is reused.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

Signature = tuple[tuple[tuple[int, ...], torch.dtype, str], ...]

aten = torch.ops.aten
_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
# Size arithmetic a symbolic graph may do, evaluated on the call's concrete sizes.
_ARITHMETIC: dict[Any, Callable[..., Any]] = {
    op: op
    for op in (
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.neg,
        operator.pow,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.and_,
        operator.or_,
        math.ceil,
        math.floor,
    )
}
_ARITHMETIC |= {torch.sym_max: max, torch.sym_min: min, torch.sym_not: operator.not_, torch.sym_float: float}
_ARITHMETIC |= {torch.sym_int: int, torch.sym_sqrt: math.sqrt}
_OF_TENSOR = {
    aten.sym_size.int: lambda t, d: t.size(d),
    aten.sym_stride.int: lambda t, d: t.stride(d),
    aten.sym_numel.default: lambda t: t.numel(),
    aten.sym_storage_offset.default: lambda t: t.storage_offset(),
}
_ASSERTS = {aten._assert_scalar.default, aten.sym_constrain_range_for_size.default}
_MISMATCH = object()


def signature(tensors: Sequence[Any]) -> Signature:
    return tuple((tuple(t.shape), t.dtype, t.device.type) for t in tensors)


@dataclass(frozen=True)
class _Fixed:
    gm: fx.GraphModule
    frozen: Mapping[int, torch.Tensor]  # compiled in as constants: only these very tensors may be passed
    options: object  # the compiling backend's options: code for other options differs


class FixedGraphs:
    """The fixed-shape graphs compiled so far, by input signature. Weak: an entry lives as
    long as its compiled callable (which Dynamo holds while the graph may be called)."""

    def __init__(self) -> None:
        self._by_signature: dict[Signature, weakref.WeakKeyDictionary[Callable, _Fixed]] = {}

    def add(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        fn: Callable,
        frozen: Mapping[int, Any],
        options: object,
    ) -> None:
        if all(isinstance(x, torch.Tensor) for x in example_inputs):
            entries = self._by_signature.setdefault(signature(example_inputs), weakref.WeakKeyDictionary())
            entries[fn] = _Fixed(gm, dict(frozen), options)

    def find(self, symbolic: fx.GraphModule, args: Sequence[Any], options: object) -> Callable | None:
        """A compiled callable computing `symbolic` at these arguments' sizes, or None. It
        takes the tensor arguments (a list) and returns the symbolic graph's outputs."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for fn, fixed in list(self._by_signature.get(signature(tensors), {}).items()):
            if fixed.options != options or any(tensors[i] is not t for i, t in fixed.frozen.items()):
                continue
            extra = match(symbolic, args, fixed.gm)
            if extra is not None:
                return fn if not extra else _with_constants(fn, extra)
        return None


def _with_constants(fn: Callable, extra: dict[int, Any]) -> Callable:
    """`fn` with the outputs only the symbolic graph has (constants at these shapes) put back."""

    def call(args: list) -> list:
        out = list(fn(args))
        for i in sorted(extra):
            out.insert(i, extra[i])
        return out

    call._boxed_call = True  # type: ignore[attr-defined]  # what make_boxed_func marks
    return call


def match(symbolic: fx.GraphModule, args: Sequence[Any], fixed: fx.GraphModule) -> dict[int, Any] | None:
    """Whether `symbolic` at the sizes in `args` is `fixed`: None if not, else the outputs of
    `symbolic` that `fixed` does not return, all constants (position -> value)."""
    env = _bind_inputs(symbolic, args, fixed)
    if env is None:
        return None
    body = iter(n for n in fixed.graph.nodes if n.op not in ("placeholder", "output"))
    for node in symbolic.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            return None
        if _is_size(node):
            value = _evaluate(node, env)
            if value is _MISMATCH:
                return None
            env[node] = value
            continue
        other = next(body, None)
        if (
            other is None
            or other.target != node.target
            or not _same(_resolve((node.args, node.kwargs), env), (other.args, other.kwargs))
        ):
            return None
        env[node] = other
    if next(body, None) is not None:
        return None
    return _match_outputs(_resolve(symbolic.graph.output_node().args[0], env), fixed.graph.output_node().args[0])


def _bind_inputs(symbolic: fx.GraphModule, args: Sequence[Any], fixed: fx.GraphModule) -> dict[fx.Node, Any] | None:
    """Symbolic placeholders -> the fixed graph's placeholders (tensors, in order) or the
    call's values (sizes)."""
    mine = [n for n in symbolic.graph.nodes if n.op == "placeholder"]
    theirs = iter(n for n in fixed.graph.nodes if n.op == "placeholder")
    if len(mine) != len(args):
        return None
    env: dict[fx.Node, Any] = {}
    for node, value in zip(mine, args):
        env[node] = next(theirs, None) if isinstance(value, torch.Tensor) else value
        if env[node] is None:
            return None
    return env if next(theirs, None) is None else None


def _is_size(node: fx.Node) -> bool:
    return node.target in _ASSERTS or isinstance(node.meta.get("val"), _SCALARS)


def _evaluate(node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = _resolve(node.args, env)
    if node.kwargs or any(a is _MISMATCH or (isinstance(a, fx.Node) and node.target not in _OF_TENSOR) for a in args):
        return _MISMATCH
    if node.target in _ASSERTS:
        return None if args[0] is True else _MISMATCH
    if node.target in _OF_TENSOR:
        val = args[0].meta.get("val") if isinstance(args[0], fx.Node) else None
        return _OF_TENSOR[node.target](val, *args[1:]) if isinstance(val, torch.Tensor) else _MISMATCH
    fn = _ARITHMETIC.get(node.target)
    if fn is None:
        return _MISMATCH
    try:
        return fn(*args)
    except (ArithmeticError, TypeError, ValueError):  # e.g. a guard this size would have failed
        return _MISMATCH


def _resolve(value: Any, env: dict[fx.Node, Any]) -> Any:
    if isinstance(value, fx.Node):
        return env.get(value, _MISMATCH)
    if isinstance(value, list | tuple):
        return type(value)(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _match_outputs(mine: Any, theirs: Any) -> dict[int, Any] | None:
    """Outputs equal but for constants the symbolic graph returns in addition: the sizes a
    forward saves for its backward, a backward's None gradient of a size input."""
    if not isinstance(mine, list | tuple) or not isinstance(theirs, list | tuple):
        return {} if _same(mine, theirs) else None
    extra, j = {}, 0
    for i, value in enumerate(mine):  # `theirs` must be a subsequence (greedy is exact for that)
        if j < len(theirs) and _same(value, theirs[j]):
            j += 1
        elif value is None or isinstance(value, int | float | bool):
            extra[i] = value
        else:
            return None
    return extra if j == len(theirs) else None
