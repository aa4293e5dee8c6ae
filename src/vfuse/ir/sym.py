"""Symbolic sizes: a size that is an expression over the symbols of a graph with dynamic shapes.

A `SymSize` stands where an int size stands (tensor types, index coefficients, loop bounds,
arena offsets) and computes like one: `+ - * // %` with ints or other sizes give new
expressions (sympy, with torch's FloorDiv/PythonMod). What it can never do is hand its value
to code that would bake it in: every decision taken on one goes through its `SymEnv`, which
either proves the answer for every size the symbols may take (their value ranges, e.g.
`768*s0 != 1` with s0 >= 2) or answers at the hint (the size of the example call) and records
a **guard**, a condition the compiled program holds only under. Reading a plain int out of a
size (`__index__`, `__int__`, `range(n)`, `numpy`, `%d`) records `n == hint`: the program is
then specialized on it, never silently wrong. Sizes format as C++ expressions over the
kernel's `vf_<symbol>` variables (`f"{n}"`, `str(n)`: renderers use both); `pretty(n)` is
the sympy form people read (`768*s0`), as the IR printer and reports show it.

The cost model reads sizes through `hint()`, which takes no guard: what it decides at the hint
may be suboptimal at another size, never wrong.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv, PythonMod
from torch.utils._sympy.value_ranges import ValueRangeError, ValueRanges, bound_sympy

CPP_PREFIX = "vf_"  # C++ name of symbol s0: vf_s0 (generated code uses s0, s1 for its own locals)
MAX_PROOF_OPS = 400  # the largest relation a proof is tried on (the test suite's reach 212)


class SymEnv:
    """The symbols of one compilation (hint and range each) and the guards taken on them."""

    def __init__(self, symbols: Mapping[sympy.Symbol, tuple[int, ValueRanges]]) -> None:
        self.symbols = tuple(sorted(symbols, key=lambda s: s.name))
        self.hints: dict[sympy.Symbol, int] = {s: int(symbols[s][0]) for s in self.symbols}
        self.ranges: dict[sympy.Symbol, ValueRanges] = {s: symbols[s][1] for s in self.symbols}
        self.guards: list[sympy.Basic] = []  # each is True for every size the program serves
        self._seen: set[sympy.Basic] = set()
        self._proofs: dict[sympy.Basic, bool | None] = {}
        # Answers by the expressions asked about (`facts`, `compare`, `smax`, hints): a schedule asks the same
        # few hundred thousands of times, and building each relation (sympy's assumptions) cost more than its proof.
        self._facts: dict[tuple[Any, ...], Any] = {}
        self._hints: tuple[dict[sympy.Symbol, int], dict[sympy.Basic, int]] = (self.hints, {})
        self.frozen = False  # after compilation: a decision then is a bug, not a guard
        self._evaluators: dict[sympy.Basic, Callable[..., int]] = {}
        self.arguments: dict[str, int] = {}  # symbols passed as size arguments: name -> argument position
        self.trace: dict[sympy.Basic, str] | None = None  # set to {} to record where each guard came from

    def size(self, expr: Any) -> SymSize | int:
        """`expr` as a size: a plain int when it is a constant."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        return SymSize(expr, self)

    def evaluator(self, expr: sympy.Basic) -> Callable[..., int]:
        """`f(*values)` (in `symbols` order) -> the value of `expr`: Python source compiled once
        per expression, for the runtime's per-size substitution (sympy would take ~50 us each)."""
        fn = self._evaluators.get(expr)
        if fn is None:
            names = ", ".join(s.name for s in self.symbols) or "_=None"
            fn = self._evaluators[expr] = eval(f"lambda {names}: {python(expr)}")
        return fn

    def hint_of(self, expr: sympy.Basic) -> int:
        if self._hints[0] is not self.hints:  # other hints (fusion/flips.py): other values
            self._hints = (self.hints, {})
        if (value := self._hints[1].get(expr)) is None:
            value = self._hints[1][expr] = int(expr.xreplace(self.hints))
        return value

    def facts(self, op: str, a: sympy.Basic, b: sympy.Basic) -> bool:
        """Whether `a op b` (op: "<", "<=", "==", "%0": a % b == 0) is proved for every size."""
        if (hit := self._facts.get(key := (op, a, b))) is None:
            cond = sympy.Eq(sympy.Mod(a, b), 0) if op == "%0" else _RELATIONS[op](a, b)
            hit = self._facts[key] = self._prove(cond) is True
        return hit

    def compare(self, rel: Callable[[Any, Any], sympy.Basic], a: sympy.Basic, b: sympy.Basic) -> bool:
        """`decide(rel(a, b))`, the relation built once (decided anew: the hints may change, fusion/flips.py)."""
        if (cond := self._facts.get(key := (rel, a, b))) is None:
            cond = self._facts[key] = rel(a, b)
        return self.decide(cond)

    def decide(self, cond: sympy.Basic) -> bool:
        """The truth of a relation between sizes: proved over the ranges, else taken at the hint
        and kept as a guard."""
        if cond in (sympy.true, sympy.false):
            return bool(cond)
        proved = self._prove(cond)
        if proved is not None:
            return proved
        value = bool(cond.xreplace(self.hints))
        self.guard(cond if value else sympy.Not(cond))
        return value

    def guard(self, cond: sympy.Basic) -> None:
        if self.frozen:
            raise RuntimeError(f"a decision on symbolic sizes after compilation: {cond}")
        if cond not in self._seen:
            self._seen.add(cond)
            self.guards.append(cond)
            if self.trace is not None:
                import traceback

                frames = [f for f in traceback.extract_stack()[:-1] if "ir/sym.py" not in f.filename]
                where = [f"{f.filename.split('vfuse/')[-1]}:{f.lineno}" for f in frames[-4:][::-1]]
                self.trace[cond] = " <- ".join(where)

    def specialize(self, expr: sympy.Basic) -> int:
        """The hint of `expr`, guarded: the program is now compiled for this value only."""
        value = self.hint_of(expr)
        self.guard(sympy.Eq(expr, value))
        return value

    def _prove(self, cond: sympy.Basic) -> bool | None:
        if cond in (sympy.true, sympy.false):
            return bool(cond)
        if cond in self._proofs:
            return self._proofs[cond]
        result = None
        if isinstance(cond, sympy.Rel) and cond.rel_op in _NONNEG:
            lhs, rhs = cond.lhs, cond.rhs
            diff = lhs - rhs if cond.rel_op in (">=", ">", "==", "!=") else rhs - lhs
            # s0*s1 - s0 bounds only as s0*(s1 - 1). Not tried: a quotient in a Mod/FloorDiv (sympy's Mod
            # divides out factors it cannot prove nonzero: it never bounds, expanding one ran for hours)
            # and a relation past MAX_PROOF_OPS (a nested Max of arena offsets took a minute to bound).
            quotient = any(map(_negative_power, diff.atoms(sympy.Mod, PythonMod, FloorDiv)))
            skip = quotient or sympy.count_ops(diff) > MAX_PROOF_OPS
            for form in (make(diff) for make in (() if skip else (sympy.expand, sympy.factor))):
                if _negative_power(form):  # torch's interval maths raises (and logs) on 1/(...): unproved
                    continue
                try:
                    r = bound_sympy(form, self.ranges)
                except (ValueRangeError, ValueError):  # any other interval-maths failure: unproved, never a crash
                    continue
                result = _NONNEG[cond.rel_op](r.lower, r.upper)
                if result is not None:
                    break
        self._proofs[cond] = result
        return result


def _negative_power(expr: sympy.Basic) -> bool:
    return any(p.exp.is_negative for p in expr.atoms(sympy.Pow))


def _rel(strict: bool) -> Callable[[Any, Any], bool | None]:
    def check(lo: Any, hi: Any) -> bool | None:
        if lo > 0 or (lo >= 0 and not strict):
            return True
        if hi < 0 or (hi <= 0 and strict):
            return False
        return None

    return check


def _eq(lo: Any, hi: Any) -> bool | None:
    if lo > 0 or hi < 0:
        return False
    return True if lo == hi == 0 else None


# How a bound [lo, hi] of (lhs - rhs), or (rhs - lhs) for < and <=, decides each relation.
_NONNEG: dict[str, Callable[[Any, Any], bool | None]] = {">=": _rel(False), ">": _rel(True), "<=": _rel(False)}
_NONNEG |= {"<": _rel(True), "==": _eq, "!=": lambda lo, hi: None if (r := _eq(lo, hi)) is None else not r}


Size = "SymSize | int"


def _expr(x: Any) -> sympy.Basic:
    if isinstance(x, SymSize):
        return x.expr
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"a symbolic size combines with ints and sizes only, not {x!r}")
    return sympy.Integer(x)


class SymSize:
    """A size given by an expression over the graph's symbols (see the module docstring)."""

    __slots__ = ("env", "expr")

    def __init__(self, expr: sympy.Basic, env: SymEnv) -> None:
        self.expr = expr
        self.env = env

    @property
    def hint(self) -> int:
        return self.env.hint_of(self.expr)

    def _new(self, expr: sympy.Basic) -> SymSize | int:
        return self.env.size(expr)

    def _bin(self, other: Any, fn: Callable[[Any, Any], Any], swap: bool = False) -> Any:
        if isinstance(other, float):  # a float result bakes the value in: specialize
            a, b = float(int(self)), other
            return fn(b, a) if swap else fn(a, b)
        if not isinstance(other, SymSize | int) or isinstance(other, bool):
            return NotImplemented
        a, b = (_expr(other), self.expr) if swap else (self.expr, _expr(other))
        if (hit := self.env._facts.get(key := (fn, a, b))) is None:  # sympy's arithmetic: once per operands
            hit = self.env._facts[key] = self._new(fn(a, b))
        return hit

    def __add__(self, o: Any) -> Any:
        return self._bin(o, operator.add)

    def __radd__(self, o: Any) -> Any:
        return self._bin(o, operator.add, True)

    def __sub__(self, o: Any) -> Any:
        return self._bin(o, operator.sub)

    def __rsub__(self, o: Any) -> Any:
        return self._bin(o, operator.sub, True)

    def __mul__(self, o: Any) -> Any:
        return self._bin(o, operator.mul)

    def __rmul__(self, o: Any) -> Any:
        return self._bin(o, operator.mul, True)

    def __floordiv__(self, o: Any) -> Any:
        return self._bin(o, FloorDiv if not isinstance(o, float) else operator.floordiv)

    def __rfloordiv__(self, o: Any) -> Any:
        return self._bin(o, FloorDiv if not isinstance(o, float) else operator.floordiv, True)

    def __mod__(self, o: Any) -> Any:
        return self._bin(o, sympy.Mod if not isinstance(o, float) else operator.mod)

    def __rmod__(self, o: Any) -> Any:
        return self._bin(o, sympy.Mod if not isinstance(o, float) else operator.mod, True)

    def __truediv__(self, o: Any) -> float:
        return int(self) / (int(o) if isinstance(o, SymSize) else o)

    def __rtruediv__(self, o: Any) -> float:
        return o / int(self)

    def __pow__(self, o: Any) -> Any:
        if isinstance(o, int) and not isinstance(o, bool) and o >= 0:
            return self._new(self.expr**o)
        return int(self) ** o

    def __neg__(self) -> Any:
        return self._new(-self.expr)

    def __pos__(self) -> SymSize:
        return self

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __divmod__(self, o: Any) -> tuple[Any, Any]:
        return self // o, self % o

    # -- decisions: proved, or guarded at the hint ------------------------------------------
    def _cmp(self, other: Any, rel: Callable[[Any, Any], sympy.Basic]) -> Any:
        if isinstance(other, float) and other.is_integer():
            other = int(other)  # a size against 2.0: compared as sizes are (proved or guarded)
        if isinstance(other, float):
            return bool(rel(float(int(self)), other))
        if not isinstance(other, SymSize | int):
            return NotImplemented
        return self.env.compare(rel, self.expr, _expr(other))

    def __eq__(self, o: object) -> Any:
        if isinstance(o, SymSize) and o.expr == self.expr:
            return True
        if isinstance(o, float) and not o.is_integer():
            return False  # a size is an integer
        if not isinstance(o, SymSize | int | float):
            return False
        return self._cmp(o, sympy.Eq)

    def __ne__(self, o: object) -> Any:
        r = self.__eq__(o)
        return r if r is NotImplemented else not r

    def __lt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Lt)

    def __le__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Le)

    def __gt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Gt)

    def __ge__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Ge)

    def __bool__(self) -> bool:
        return self.env.decide(sympy.Ne(self.expr, 0))

    def __hash__(self) -> int:
        return hash(self.expr)

    # -- values leaving the symbolic world: specialized ---------------------------------------
    def __index__(self) -> int:
        return self.env.specialize(self.expr)

    def __int__(self) -> int:
        return self.env.specialize(self.expr)

    def __float__(self) -> float:
        return float(self.env.specialize(self.expr))

    def __round__(self, ndigits: int | None = None) -> int:
        return int(self)

    def __trunc__(self) -> int:
        return int(self)

    def __floor__(self) -> int:
        return int(self)

    def __ceil__(self) -> int:
        return int(self)

    def __and__(self, o: Any) -> int:
        return int(self) & int(o)

    def __or__(self, o: Any) -> int:
        return int(self) | int(o)

    def __lshift__(self, o: Any) -> int:
        return int(self) << int(o)

    def __rshift__(self, o: Any) -> int:
        return int(self) >> int(o)

    def bit_length(self) -> int:
        return int(self).bit_length()

    # -- printing --------------------------------------------------------------------------
    def __str__(self) -> str:
        # C++ as `format` gives: renderers join sizes with str() too. People read `pretty()`.
        return cpp(self.expr)

    def __repr__(self) -> str:
        return f"SymSize({self.expr} ~ {self.hint})"

    def __format__(self, spec: str) -> str:
        """C++ (`f"{n}"` in a renderer); a format spec bakes the value in, so specializes."""
        if spec:
            return format(int(self), spec)
        return cpp(self.expr)

    # torch / numpy / copy treat it as a value of its own: never as an int behind our back.
    def __reduce__(self) -> Any:
        raise TypeError(f"symbolic size {self.expr} cannot be pickled")

    def __copy__(self) -> SymSize:
        return self

    def __deepcopy__(self, memo: Any) -> SymSize:
        return self


def pretty(x: Any) -> str:
    """A size as people read it: `768*s0` for a symbolic one."""
    return str(x.expr) if isinstance(x, SymSize) else str(x)


def is_sym(x: Any) -> bool:
    return isinstance(x, SymSize)


def hint(x: Any) -> Any:
    """An int at the example sizes, no guard: for the cost model and reports only."""
    if isinstance(x, SymSize):
        return x.hint
    if isinstance(x, tuple | list):
        return type(x)(hint(v) for v in x)
    return x


def same(a: Any, b: Any) -> bool:
    """Structural equality of sizes or shapes: equal ints, or identical expressions; no guard.
    For checks whose "no" is always safe (a no-op test, a fusion's legality), where `==`
    would guard on an undecidable pair of symbols."""
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, SymSize) or isinstance(b, SymSize):
        return isinstance(a, SymSize) and isinstance(b, SymSize) and a.expr == b.expr
    return bool(a == b)


def proved(a: Any, op: str, b: Any) -> bool:
    """Whether `a op b` ("<", "<=", "==") holds for every size: plain ints compare, symbolic
    sizes are proved over the ranges; never a guard (False when it may not hold)."""
    if not isinstance(a, SymSize) and not isinstance(b, SymSize):
        return a < b if op == "<" else a <= b if op == "<=" else a == b
    env = a.env if isinstance(a, SymSize) else b.env
    return env.facts(op, _expr(a), _expr(b))


_RELATIONS = {"<": sympy.Lt, "<=": sympy.Le, "==": sympy.Eq}


def smax(a: Any, b: Any) -> Any:
    """max(a, b) without a guard: the larger where proved, else the expression Max(a, b)."""
    if proved(b, "<=", a):
        return a
    if proved(a, "<=", b):
        return b
    env = a.env if isinstance(a, SymSize) else b.env
    # sympy's Max compares its arguments again (~2 ms each): once per pair.
    if (hit := env._facts.get(key := ("max", _expr(a), _expr(b)))) is None:
        hit = env._facts[key] = env.size(sympy.Max(*key[1:]))
    return hit


def known_multiple(x: Any, m: int) -> bool:
    """Whether `x % m == 0` holds for every size (proved, no guard): False when it may not."""
    if not isinstance(x, SymSize) and not isinstance(m, SymSize):
        return x % m == 0
    env = x.env if isinstance(x, SymSize) else m.env
    return env.facts("%0", _expr(x), _expr(m))


def env_of(values: Iterable[Any]) -> SymEnv | None:
    """The SymEnv of the first symbolic size among `values` (shapes), if any."""
    for v in values:
        for d in v if isinstance(v, tuple) else (v,):
            if isinstance(d, SymSize):
                return d.env
    return None


def free_symbols(values: Iterable[Any]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for v in values:
        if isinstance(v, SymSize):
            out |= v.expr.free_symbols
    return out


def cpp_name(s: sympy.Symbol) -> str:
    return f"{CPP_PREFIX}{s.name}"


def cpp(expr: sympy.Basic) -> str:
    """A size expression as C++ over int64_t `vf_<symbol>` variables (floor/mod as Python's)."""
    return _print(expr, _CPP)


def python(expr: sympy.Basic) -> str:
    """The same expression as Python source over the symbols' plain names."""
    return _print(expr, _PY)


_CPP = {
    "sym": cpp_name,
    "int": lambda v: f"{v}LL" if abs(v) > 2**31 - 1 else str(v),
    "floordiv": "vf_floordiv({a}, {b})",
    "mod": "vf_pymod({a}, {b})",
    "max": "std::max<int64_t>({a}, {b})",
    "min": "std::min<int64_t>({a}, {b})",
}
_PY = {
    "sym": lambda s: s.name,
    "int": str,
    "floordiv": "(({a}) // ({b}))",
    "mod": "(({a}) % ({b}))",
    "max": "max({a}, {b})",
    "min": "min({a}, {b})",
}


def _print(e: sympy.Basic, how: Mapping[str, Any]) -> str:
    if e.is_Integer:
        return how["int"](int(e))
    if e.is_Symbol:
        return how["sym"](e)
    if e.is_Add:
        return "(" + " + ".join(_print(a, how) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + "*".join(_print(a, how) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + "*".join([_print(e.base, how)] * int(e.exp)) + ")"
    # sympy's Mod is Python's (the divisor's sign), as torch's PythonMod.
    binary = {FloorDiv: "floordiv", PythonMod: "mod", sympy.Mod: "mod", sympy.Max: "max", sympy.Min: "min"}
    for fn, key in binary.items():
        if isinstance(e, fn):
            out = _print(e.args[0], how)
            for b in e.args[1:]:
                out = how[key].format(a=out, b=_print(b, how))
            return out
    raise TypeError(f"no printer for size expression {e} ({type(e).__name__})")
