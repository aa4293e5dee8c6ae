"""Lowerings for what optimizer steps put in their graphs, with eager's roundings.

Eager's CPU kernels for `add(a, b, alpha=)`, `lerp`, `addcmul` use a fused multiply-add
(ATen's `vec::fmadd`, and g++ contracts `self + value * t1 * t2`), while vfuse's kernels are
built without contraction. Lowered as a multiply and an add, a compiled optimizer step was
off by an ulp in ~1 % of elements, compounding over steps. Here each becomes an exact fma:
for fp32/bf16/fp16 operands the product is exact in fp64 and the sum is rounded there, then
to the result dtype (a result can differ from a true fma only when the fp64 sum lies exactly
halfway between two results, about 2^-29 of cases). fp64 has no wider type: a multiply and
an add (at most one ulp from eager).

Dynamo rewrites `t.addcmul_(a, b, value=v)` into `prims.fma(a * b, v, t)` and
`t.addcdiv_(a, b, value=v)` into `prims.fma(a / b, v, t)` (inductor's prim: a * b + c rounded
once); when the product or quotient has no other use, they are lowered as eager computes
addcmul_ (fma(v * a, b, t)) and addcdiv_ (t + (v * a) / b).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.registry import TABLE, lowers
from vfuse.ir import DType, Op

aten = torch.ops.aten
NARROW = (DType.F32, DType.BF16, DType.F16)  # fp64 holds their products exactly


def fused_multiply_add(em: Emitter, a: str, b: str, c: str, dtype: DType) -> str:
    """a * b + c rounded once to `dtype` (see the module doc; fp64: rounded twice)."""
    if dtype not in NARROW:
        return em.emit(Op.ADD, (em.emit(Op.MUL, (em.cast(a, dtype), em.cast(b, dtype))), em.cast(c, dtype)))
    wide = [em.cast(x, DType.F64) for x in (a, b, c)]
    return em.cast(em.emit(Op.ADD, (em.emit(Op.MUL, (wide[0], wide[1])), wide[2])), dtype)


def opmath(dtype: DType) -> DType:
    """The type eager computes fp16/bf16 arithmetic in."""
    return DType.F32 if dtype in (DType.F16, DType.BF16) else dtype


def _operand(em: Emitter, x: Any, dtype: DType) -> str:
    """A tensor in its own dtype (cast to `dtype` when it differs), a python scalar rounded to the
    opmath type of `dtype` (what eager's kernels convert a scalar argument to)."""
    return em.operand(x, dtype if isinstance(x, torch.fx.Node) else opmath(dtype))


def _sole_use(node: Any, target: Any, user: torch.fx.Node) -> bool:
    return isinstance(node, torch.fx.Node) and node.target == target and list(node.users) == [user]


@lowers("prims.fma.default")  # by name: inductor registers the op when first imported
def lower_fma(em: Emitter, node: torch.fx.Node) -> str:
    a, b, c = node.args[:3]
    dtype = em.out_dtype()
    if _sole_use(a, aten.mul.Tensor, node) and not isinstance(b, torch.fx.Node):
        x, y = a.args[:2]  # type: ignore[union-attr]
        if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node):
            # addcmul_: eager's fma(value * t1, t2, self), value * t1 rounded in the opmath type.
            vx = em.emit(Op.MUL, (_operand(em, b, dtype), em.cast(em.value(x), opmath(dtype))))
            return fused_multiply_add(em, vx, em.value(y), em.cast(em.value(c), dtype), dtype)
    if _sole_use(a, aten.div.Tensor, node) and not isinstance(b, torch.fx.Node) and dtype.is_float:
        x, y = a.args[:2]  # type: ignore[union-attr]
        if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node) and not a.kwargs:  # type: ignore[union-attr]
            # addcdiv_: eager's self + (value * t1) / t2 in the opmath type.
            calc = opmath(dtype)
            vx = em.emit(Op.MUL, (_operand(em, b, dtype), em.cast(em.value(x), calc)))
            q = em.emit(Op.DIV, (vx, em.cast(em.value(y), calc)))
            return em.cast(em.emit(Op.ADD, (em.cast(em.value(c), calc), q)), dtype)
    return fused_multiply_add(em, _operand(em, a, dtype), _operand(em, b, dtype), _operand(em, c, dtype), dtype)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def lower_lerp(em: Emitter, node: torch.fx.Node) -> str:
    """ATen's lerp: fma(w, end - start, start) for |w| < 0.5, else fma(w - 1, end - start, end),
    in the opmath type."""
    args = bind(node)
    dtype = em.out_dtype()
    calc = opmath(dtype)
    start, end = (em.cast(em.value(args[k]), calc) for k in ("self", "end"))
    w = (
        _operand(em, args["weight"], calc)
        if isinstance(args["weight"], torch.fx.Node)
        else em.scalar(args["weight"], calc)
    )
    small = em.emit(Op.LT, (em.emit(Op.ABS, (w,)), em.scalar(0.5, calc)))
    coeff = em.emit(Op.WHERE, (small, w, em.emit(Op.SUB, (w, em.scalar(1, calc)))))
    base = em.emit(Op.WHERE, (small, start, end))
    return fused_multiply_add(em, coeff, em.emit(Op.SUB, (end, start)), base, dtype)


# -- the _foreach_* ops of foreach=True optimizers: each element lowered as its per-tensor op --


@dataclass
class _Element:
    """Element i of a foreach op, as the per-tensor op's lowering reads an FX node: target,
    arguments, the FakeTensor it makes, and the foreach node's name (the IR nodes' origin)."""

    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    name: str
    users: dict[Any, None] = field(default_factory=dict)


UNARY = ("sqrt", "neg", "reciprocal", "exp", "abs", "sign", "sigmoid", "log", "tanh", "rsqrt", "sin", "cos")
BINARY = {  # foreach overload name -> per-tensor overload, by the kind of `other`
    "add": "Tensor", "sub": "Tensor", "mul": "Tensor", "div": "Tensor",
    "maximum": "default", "minimum": "default", "clamp_min": None, "clamp_max": None,
}  # fmt: skip


def _per_tensor(name: str, overload: str) -> Any:
    """The aten op that does to one tensor what `_foreach_<name>.<overload>` does to each."""
    if name in UNARY:
        return getattr(aten, name).default
    if name == "pow":
        table = {"List": "Tensor_Tensor", "Scalar": "Tensor_Scalar", "ScalarList": "Tensor_Scalar"}
        return aten.pow.Scalar if overload == "ScalarAndTensor" else getattr(aten.pow, table[overload])
    if name in ("clamp_min", "clamp_max"):
        return getattr(getattr(aten, name), "Tensor" if overload == "List" else "default")
    if name == "lerp":
        return aten.lerp.Tensor if overload == "List" else aten.lerp.Scalar
    if name == "copy":
        return aten.copy.default
    return getattr(getattr(aten, name), BINARY[name])


def _elements(node: torch.fx.Node, i: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Element i's arguments: lists give their i-th item, scalars and tensors stay."""
    pick = [a[i] if isinstance(a, list | tuple) else a for a in node.args]
    kwargs = {k: (v[i] if isinstance(v, list | tuple) else v) for k, v in node.kwargs.items()}
    return tuple(pick), kwargs


def lower_foreach_op(em: Emitter, node: torch.fx.Node) -> tuple[str, ...]:
    """A `_foreach_*` op: each element through the per-tensor op's own lowering."""
    name, overload = node.target._opname.removeprefix("_foreach_"), node.target._overloadname  # type: ignore[union-attr]
    if name in ("addcmul", "addcdiv"):
        return _addc(em, node, name == "addcmul")
    target = _per_tensor(name, overload)
    fn = TABLE.get(target) or TABLE.get(target.overloadpacket)  # (all families are loaded by now)
    if fn is None:
        raise Fallback(f"no lowering for {target}, the per-tensor op of _foreach_{name}")
    vals, outer = node.meta["val"], em.current
    out = []
    try:
        for i in range(len(vals)):
            args, kwargs = _elements(node, i)
            em.current = _Element(target, args, kwargs, {"val": vals[i]}, node.name)  # type: ignore[assignment]
            out.append(fn(em, em.current))  # type: ignore[arg-type]
    finally:
        em.current = outer
    return tuple(out)


def _addc(em: Emitter, node: torch.fx.Node, mul: bool) -> tuple[str, ...]:
    """addcmul: eager's fma(value * t1, t2, self); addcdiv: self + (value * t1) / t2."""
    selves, t1s, t2s = node.args[:3]
    values = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", 1)
    if isinstance(values, torch.fx.Node):
        raise Fallback("scalars given as a tensor: their values are not known when compiling")
    out = []
    for i, val in enumerate(node.meta["val"]):
        dtype, calc = DType.from_torch(val.dtype), opmath(DType.from_torch(val.dtype))
        v = values[i] if isinstance(values, list | tuple) else values
        vx = em.emit(Op.MUL, (em.scalar(v, calc), em.cast(em.value(t1s[i]), calc)))  # type: ignore[index]
        if mul:
            out.append(fused_multiply_add(em, vx, em.value(t2s[i]), em.value(selves[i]), dtype))  # type: ignore[index]
        else:
            q = em.emit(Op.DIV, (vx, em.cast(em.value(t2s[i]), calc)))  # type: ignore[index]
            out.append(em.cast(em.emit(Op.ADD, (em.cast(em.value(selves[i]), calc), q)), dtype))  # type: ignore[index]
    return tuple(out)


OVERLOADS = ("default", "Scalar", "List", "Tensor", "ScalarList", "ScalarAndTensor")


def _register() -> None:
    """Every functional overload of the foreach ops above (maximum/minimum: of two lists only)."""
    ops = []
    for n in (*UNARY, *BINARY, "pow", "lerp", "copy", "addcmul", "addcdiv"):
        packet = getattr(aten, f"_foreach_{n}", None)
        names = ("List",) if n in ("maximum", "minimum") else OVERLOADS
        ops += [getattr(packet, o) for o in names if packet is not None and o in packet.overloads()]
    lowers(*ops)(lower_foreach_op)


_register()
