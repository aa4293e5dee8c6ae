"""Triton spellings of dtypes, literals, parameters and index expressions.

Values are held in their compute type: fp16 and bf16 in fp32 (rounded where stored or cast, as
the C++ path and Inductor do), every other dtype in itself (integer wrap-around as in torch).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vfuse.ir import DType
from vfuse.schedule.expr import Clamp, Div, Dyn, Lin, Mod, Var
from vfuse.schedule.kernel import Loop

TL: dict[DType, str] = {
    DType.F32: "tl.float32",
    DType.F64: "tl.float64",
    DType.F16: "tl.float16",
    DType.BF16: "tl.bfloat16",
    DType.F8E4M3: "tl.float8e4nv",
    DType.F8E5M2: "tl.float8e5",
    DType.I8: "tl.int8",
    DType.U8: "tl.uint8",
    DType.I16: "tl.int16",
    DType.I32: "tl.int32",
    DType.I64: "tl.int64",
    DType.BOOL: "tl.int1",
}
COMPUTE: dict[DType, str] = {
    **TL,
    **{d: "tl.float32" for d in (DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2)},
}
# fp8 -> fp32 by integer ops (exact, NaN and inf included: the interpreter's own conversion is not).
WIDEN_FP8: dict[DType, str] = {DType.F8E4M3: "_vf_e4m3_2f", DType.F8E5M2: "_vf_e5m2_2f"}
# Pointer element types of an offline compile's signature (triton.compile).
SIGNATURE: dict[DType, str] = {
    DType.F32: "*fp32",
    DType.F64: "*fp64",
    DType.F16: "*fp16",
    DType.BF16: "*bf16",
    DType.F8E4M3: "*fp8e4nv",
    DType.F8E5M2: "*fp8e5",
    DType.I8: "*i8",
    DType.U8: "*u8",
    DType.I16: "*i16",
    DType.I32: "*i32",
    DType.I64: "*i64",
    DType.BOOL: "*i1",
}
LOWEST = {DType.I8: -(2**7), DType.U8: 0, DType.I16: -(2**15), DType.I32: -(2**31), DType.I64: -(2**63)}
HIGHEST = {DType.I8: 2**7 - 1, DType.U8: 2**8 - 1, DType.I16: 2**15 - 1, DType.I32: 2**31 - 1, DType.I64: 2**63 - 1}


def param(value: str) -> str:
    """The parameter name of an IR value's buffer (IR names need not be identifiers)."""
    clean = re.sub(r"\W", "_", value)
    if clean == value:
        return f"p_{value}"
    return f"p_{clean}_{hashlib.sha1(value.encode()).hexdigest()[:6]}"


def literal(value: object, dtype: DType) -> str:
    """A scalar of `dtype`'s compute type equal to torch.full((), value, dtype) (fp16/bf16 rounded
    like torch)."""
    if dtype is DType.BOOL:
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    if not dtype.is_float:
        return f"tl.full([], {int(value)}, {TL[dtype]})"  # type: ignore[call-overload]
    v = float(torch.tensor(value, dtype=dtype.torch).item())
    text = repr(v) if math.isfinite(v) else f'float("{v}")'
    return f"tl.full([], {text}, {COMPUTE[dtype]})"


@dataclass
class LoopGroup:
    """Loops walked through one flat index (`flat`, a Triton value): a kernel's row loops or its
    row, or the whole nest of a pointwise kernel."""

    flat: str
    loops: Sequence[Loop]

    def stride(self, k: int) -> int:
        return math.prod(lp.size for lp in self.loops[k + 1 :])


@dataclass
class IndexWriter:
    """Renders `Lin` index expressions over loop groups; the names they need (loop variables,
    runs of loops) are collected per group and written by `take` where its flat index is known."""

    groups: Sequence[LoopGroup]
    used: dict[str, dict[str, str]] = field(default_factory=dict)  # group flat -> name -> definition

    def _where(self, var: int) -> tuple[LoopGroup, int]:
        for g in self.groups:
            for k, lp in enumerate(g.loops):
                if lp.var == var:
                    return g, k
        raise KeyError(f"loop variable {var} is not in this kernel's loops")

    def render(self, e: Lin) -> str:
        parts: list[str] = []
        left = dict(e.terms)
        for g in self.groups:
            parts += self._suffix(g, left)
        for a, c in left.items():
            parts.append(self._term(a, c))
        if e.const or not parts:
            parts.append(str(e.const))
        return " + ".join(parts).replace("+ -", "- ")

    def _suffix(self, g: LoopGroup, left: dict) -> list[str]:
        """The longest run of `g`'s innermost loops that `left` walks row-major (coefficient m
        times the loop's stride) as one term: m * (flat % extent), contiguous for the compiler."""
        n = len(g.loops)
        if not n:
            return []
        m = left.get(Var(g.loops[-1].var), 0)
        if not m:
            return []
        k = n - 1
        while k > 0 and left.get(Var(g.loops[k - 1].var), 0) == m * g.stride(k - 1):
            k -= 1
        for lp in g.loops[k:]:
            del left[Var(lp.var)]
        name = g.flat if k == 0 else self._define(g, f"{g.flat}m{k}", f"{g.flat} % {g.stride(k - 1)}")
        return [name if m == 1 else f"{m} * {name}"]

    def _define(self, g: LoopGroup, name: str, definition: str) -> str:
        self.used.setdefault(g.flat, {}).setdefault(name, definition)
        return name

    def _var(self, v: Var) -> str:
        g, k = self._where(v.id)
        size, stride = g.loops[k].size, g.stride(k)
        text = g.flat if stride == 1 else f"({g.flat} // {stride})"
        return self._define(g, f"i{v.id}_", f"{text} % {size}" if k else text)

    def _term(self, a: object, c: int) -> str:
        if isinstance(a, Var):
            s = self._var(a)
        elif isinstance(a, Div):
            s = f"(({self.render(a.arg)}) // {a.divisor})"
        elif isinstance(a, Mod):
            s = f"(({self.render(a.arg)}) % {a.divisor})"
        elif isinstance(a, Clamp):
            s = f"tl.minimum(tl.maximum({self.render(a.arg)}, {a.lo}), {a.hi})"
        else:
            assert isinstance(a, Dyn)
            s = a.name
        return s if c == 1 else f"{c} * {s}"

    def take(self, group: LoopGroup) -> list[str]:
        """`name = definition` lines of the names of `group` used since the last `take`."""
        return [f"{n} = {d}" for n, d in self.used.pop(group.flat, {}).items()]
