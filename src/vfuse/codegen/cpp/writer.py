"""The C++ code writer every kernel renderer builds on (it imports no renderer, only the tables).

`KernelWriter` holds one function's lines and renders statements, accumulators and loops
with the rules of `rules.py`. Renderers write through its small public API: `w` (a line),
`open` / `close` (a braced block), `indent`, `mark` / `insert` (lines placed earlier once
known), `begin_pass` / `end_pass` (a pass's row facts). It decides nothing: every choice
comes from the schedule's Kernel and Pass fields.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vfuse.codegen.cpp.faults import FAULT_VAR, NO_FAULT, fault_compute, is_fault_site
from vfuse.codegen.cpp.rules import COMPUTE_TYPE, CPP_RULES, LOAD_CONVERT, REDUCE_RULES, STORAGE_TYPE, STORE_CONVERT
from vfuse.ir import DType, Op, opdef
from vfuse.ir.sym import is_sym
from vfuse.schedule import expr
from vfuse.schedule.kernel import (
    Buffer,
    BufKind,
    Compute,
    Const,
    Iota,
    Kernel,
    Load,
    Loop,
    Pass,
    Program,
    Rand,
    RandKey,
    Range,
    Reduce,
    Select,
    Stmt,
    Store,
)


def pointer(value: str) -> str:
    """The C++ name of the pointer to an IR value's buffer (IR names need not be identifiers)."""
    clean = re.sub(r"\W", "_", value)
    if clean == value:
        return f"p_{value}"
    return f"p_{clean}_{hashlib.sha1(value.encode()).hexdigest()[:6]}"


def literal(value: object, dtype: DType) -> str:
    """A C++ literal equal to torch.full((), value, dtype) (fp16/bf16 rounded like torch)."""
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if is_sym(value):  # a symbolic size (ir/sym.py), converted as torch.full converts an int
        return f"(({COMPUTE_TYPE[dtype]})({value}))"
    if not dtype.is_float:
        return f"(({COMPUTE_TYPE[dtype]}){int(value)}LL)"  # type: ignore[call-overload]
    v = float(torch.tensor(value, dtype=dtype.torch).item())
    ct = COMPUTE_TYPE[dtype]
    if math.isnan(v):
        return f"std::numeric_limits<{ct}>::quiet_NaN()"
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}std::numeric_limits<{ct}>::infinity()"
    return f"(({ct}){v.hex()})"


def pointer_line(v: str, b: Buffer, written: bool) -> str:
    """The declaration of `v`'s pointer inside a kernel (const unless the kernel writes it)."""
    st = "int64_t" if b.kind is BufKind.SEED else STORAGE_TYPE[b.type.dtype]
    const = "" if written else "const "
    src = {
        BufKind.INPUT: f"bufs[{b.slot}]",
        BufKind.OUTPUT: f"bufs[{b.slot}]",
        BufKind.ARENA: f"(arena + {b.slot})",
        BufKind.SEED: f"(seeds + {b.slot})",
    }[b.kind]
    return f"{const}{st}* __restrict {pointer(v)} = ({const}{st}*){src};"


class KernelWriter:
    """Writes one kernel function; `dtypes` tracks each variable's IR dtype."""

    def __init__(self, kernel: Kernel, program: Program) -> None:
        self.k = kernel
        self.program = program
        self.dtypes: dict[str, DType] = {}
        self.names = {lp.var: f"i{lp.var}" for lp in (*kernel.outer, *kernel.inner)}
        self.lines: list[str] = []
        self.fault = FAULT_VAR  # where integer divisions report division by zero
        self._depth = 1
        self._recips: dict[str, str] = {}  # divisors of the current pass -> their 1/d's variable
        self._nonpos: frozenset[str] = frozenset()  # values of the current pass known <= 0 or NaN
        self._fmas: dict[str, str] = {}  # values of the current pass rendered as one fma -> that fma
        self._made = 0  # helper variables named so far (`fresh`)
        self._exact: set[str] = set()  # fp16/bf16 values known representable (loads, casts into them)
        self.unclamped: int | None = None  # loop var whose index clamps are inactive here (a peel's interior)
        self.range: tuple[int, Range] | None = None  # (SIMD loop var, the range of it rendered: peel.py)

    # ---- lines ----
    def w(self, line: str) -> None:
        """Write one line at the current indentation."""
        self.lines.append("  " * self._depth + line)

    def open(self, line: str) -> None:
        """Write `line` (ending in `{`) and indent what follows until `close`."""
        self.w(line)
        self._depth += 1

    def close(self, n: int = 1) -> None:
        for _ in range(n):
            self._depth -= 1
            self.w("}")

    @contextmanager
    def indent(self, levels: int = 1) -> Iterator[None]:
        """Indent the lines written inside (a block whose braces the caller writes itself)."""
        self._depth += levels
        try:
            yield
        finally:
            self._depth -= levels

    def mark(self) -> int:
        """Where the next line goes, for `insert`."""
        return len(self.lines)

    def insert(self, at: int, lines: list[str]) -> None:
        """Put `lines` at `mark()` position `at`, indented as the current line (declarations
        written once the statements after them have been rendered)."""
        self.lines[at:at] = ["  " * self._depth + line for line in lines]

    def fresh(self, base: str) -> str:
        """A variable name no other line of this function declares: passes of a row share one
        scope, so a helper named only after its IR value (t3_rcp) was declared twice when two
        passes both needed it."""
        self._made += 1
        return f"{base}_{self._made}"

    def idx(self, e: expr.Lin) -> str:
        if self.unclamped is not None:  # the interior of a peeled loop (schedule/peel.py)
            e = expr.unclamp(e, self.unclamped)
        if self.range is not None:  # a range of a SIMD loop split at a CAT's pieces (schedule/peel.py)
            var, r = self.range
            e = expr.within(e, var, r.lo, r.hi, r.block, r.block_var)
        return expr.render(e, self.names)

    # ---- statements ----
    def stmt(self, s: Stmt | Store) -> None:
        if self.range is not None and not isinstance(s, Store) and s.var in self.range[1].dead:
            return  # another piece's input, not read in this range
        if isinstance(s, Store):
            if s.dtype is DType.BOOL:  # as bytes: a bool store next to float math left g++ 12's loop scalar
                self.w(f"((uint8_t*){pointer(s.buf)})[{self.idx(s.index)}] = (uint8_t)({s.arg});")
                return
            conv = STORE_CONVERT.get(s.dtype, "{0}").format(s.arg)
            self.w(f"{pointer(s.buf)}[{self.idx(s.index)}] = {conv};")
            return
        if isinstance(s, RandKey):
            self.w(f"const vf_key {s.var} = vf_rand_key({s.seed}, {s.stream});")
            return
        dtype = DType.F32 if isinstance(s, Rand) else s.dtype
        self.dtypes[s.var] = dtype
        if dtype in STORE_CONVERT and (isinstance(s, Load) or (isinstance(s, Compute) and s.op is Op.CAST)):
            self._exact.add(s.var)
        self.w(f"const {COMPUTE_TYPE[dtype]} {s.var} = {self.value(s)};")

    def value(self, s: Stmt) -> str:
        if isinstance(s, Load):
            if s.dtype is DType.BOOL:  # as bytes, like bool stores: a bool load's select stayed a branch
                return f"(((const uint8_t*){pointer(s.buf)})[{self.idx(s.index)}] != 0)"
            return LOAD_CONVERT.get(s.dtype, "{0}").format(f"{pointer(s.buf)}[{self.idx(s.index)}]")
        if isinstance(s, Const):
            return literal(s.value, s.dtype)
        if isinstance(s, Iota):
            return self.iota(s)
        if isinstance(s, Rand):
            return f"vf_rand({s.key}, (uint64_t)({self.idx(s.index)}))"
        if isinstance(s, Select):
            if self.range is not None and (pick := dict(self.range[1].picks).get(s.var)) is not None:
                return s.args[pick]
            c = self.idx(s.coord)
            out = s.args[-1]
            for b, a in reversed(list(zip(s.bounds, s.args, strict=False))):
                out = f"(({c}) < {b} ? {a} : {out})"
            return out
        assert isinstance(s, Compute)
        return self.compute(s)

    def compute(self, s: Compute) -> str:
        if s.var in self._fmas:
            return self._fmas[s.var]
        if s.op is Op.DIV and s.args[1] in self._recips:
            return f"({s.args[0]} * {self._recips[s.args[1]]})"
        if s.op is Op.EXP and s.args[0] in self._nonpos:
            return f"vf_exp_nonpos({s.args[0]})"
        if is_fault_site(s):
            return fault_compute(s, self.fault)
        ct = COMPUTE_TYPE[s.dtype]
        args = s.args
        src = s.arg_dtypes[0] if s.op is Op.CAST else s.dtype
        if src in STORE_CONVERT and src is not s.dtype and args[0] not in self._exact:
            # fp16/bf16 arithmetic is computed in fp32; a cast out of it sees the rounded value, as in torch.
            args = (LOAD_CONVERT[src].format(STORE_CONVERT[src].format(args[0])),)
        text = CPP_RULES[s.op].format(*args, T=ct, **dict(s.attrs.items()))
        if s.op is Op.CAST and s.dtype in STORE_CONVERT:
            # fp16/bf16 are computed in fp32, but an explicit cast must round like torch does.
            return LOAD_CONVERT[s.dtype].format(STORE_CONVERT[s.dtype].format(text))
        return text

    def iota(self, s: Iota) -> str:
        ct = COMPUTE_TYPE[s.dtype]
        i = self.idx(s.index)
        # A symbolic start or step (a tap's offset times a run-time width) is read at run time,
        # not turned into this size's number (which would guard the program to it).
        if s.dtype.is_float:
            start, step = (f"(double)({v})" if is_sym(v) else f"(double){float(v)!r}" for v in (s.start, s.step))
            return f"({ct})({start} + {step} * (double)({i}))"
        start, step = (f"(int64_t)({v})" if is_sym(v) else f"{int(v)}LL" for v in (s.start, s.step))
        return f"({ct})({start} + {step} * ({i}))"

    # ---- a pass's row facts ----
    def begin_pass(self, p: Pass) -> None:
        """Hoist the reciprocals of `p`'s pass-invariant divisors; note its values known to be
        <= 0 (the schedule's `Pass.recips` and `Pass.nonpos`); note its products whose add is
        rendered as one fma (`Pass.muladds`)."""
        self._recips = {d: self.fresh(f"{d}_rcp") for d in p.recips}
        for d, name in self._recips.items():
            self.w(f"const float {name} = 1.0f / (float){d};")
        self._nonpos = frozenset(p.nonpos)
        self._fmas.update({var: f"vf_fmaf({a}, {b}, {c})" for var, a, b, c in p.muladds})

    def end_pass(self) -> None:
        self._recips, self._nonpos, self._fmas = {}, frozenset(), {}

    # ---- reductions ----
    def acc_type(self, r: Reduce) -> str:
        return COMPUTE_TYPE[r.arg_dtype if opdef(r.op).returns_index else r.dtype]

    def declare_acc(self, r: Reduce, name: str, size: int = 0) -> None:
        """A scalar accumulator, or with `size` an array of them (one per column of a tile)."""
        init = REDUCE_RULES[r.op][0].format(T=self.acc_type(r))
        arr, at, pad = (f"[{size}]", "[c]", "  ") if size else ("", "", "")
        index = opdef(r.op).returns_index
        self.w(f"{self.acc_type(r)} {name}{arr};")
        if r.tracks_nan:
            self.w(f"int {name}_nan{arr};")
        if index:
            self.w(f"int64_t {name}_idx{arr};")
        if size:
            self.w(f"for (int64_t c = 0; c < {size}; ++c) {{")
        self.w(f"{pad}{name}{at} = {init};")
        if r.tracks_nan:
            self.w(f"{pad}{name}_nan{at} = 0;")
        if index:
            self.w(f"{pad}{name}_idx{at} = 0;")
        if size:
            self.w("}")

    def update(self, r: Reduce, name: str, at: str = "") -> None:
        x = r.arg
        if r.op not in (Op.ANY, Op.ALL) and r.arg_dtype is not r.dtype and not opdef(r.op).returns_index:
            x = f"({self.acc_type(r)}){x}"
        acc = f"{name}{at}"
        self.w(REDUCE_RULES[r.op][1].format(acc=acc, x=x, idx=f"{name}_idx{at}", r=self.idx(r.rindex)))
        if r.tracks_nan:
            self.w(f"{name}_nan{at} |= ({r.arg} != {r.arg});")

    def clauses(self, reduces: tuple[Reduce, ...], suffix: str) -> str:
        out = []
        for r in reduces:
            op = REDUCE_RULES[r.op][2]
            out.append(f"reduction({op}:{r.var}{suffix})")
            if r.tracks_nan:
                out.append(f"reduction(|:{r.var}{suffix}_nan)")
        return " ".join(out)

    def combine(self, r: Reduce, part: str, at: str = "") -> None:
        self.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}_acc{at}", part=f"{part}{at}"))
        if r.tracks_nan:
            self.w(f"{r.var}_acc_nan{at} |= {part}_nan{at};")

    def finish(self, r: Reduce, at: str = "") -> None:
        acc = f"{r.var}_acc"
        ct = COMPUTE_TYPE[r.dtype]
        if opdef(r.op).returns_index:
            val = f"{acc}_idx{at}"
        elif r.tracks_nan:
            val = f"({acc}_nan{at} ? std::numeric_limits<{ct}>::quiet_NaN() : ({ct}){acc}{at})"
        else:
            val = f"({ct}){acc}{at}"
        self.dtypes[r.var] = r.dtype
        self.w(f"const {ct} {r.var} = {val};")

    # ---- loops ----
    def body(self, p: Pass, reduces_on: str, at: str = "") -> None:
        ridx = self.idx(self.k.row_index)
        for v in p.reloaded:
            self.w(f"const {COMPUTE_TYPE[self.dtypes[v]]} {v} = rb_{v}[{ridx}];")
        for s in p.body:
            self.stmt(s)
            if not isinstance(s, Store) and s.var in p.buffered:
                self.w(f"rb_{s.var}[{ridx}] = {s.var};")
        for r in p.reduces:
            self.update(r, f"{r.var}{reduces_on}", at)

    def open_loop(self, lp: Loop, start: str = "0", end: str | None = None) -> None:
        v = self.names[lp.var]
        self.open(f"for (int64_t {v} = {start}; {v} < {end or lp.size}; ++{v}) {{")

    def pointers(self) -> None:
        stored = {s.buf for p in self.k.passes for s in p.body if isinstance(s, Store)}
        stored |= {s.buf for s in self.k.after if isinstance(s, Store)}
        for v in self.k.buffers:
            self.w(pointer_line(v, self.program.buffers[v], v in stored))

    def row_buffers(self, alloc: bool) -> list[str]:
        """The lines allocating (or freeing) the kernel's row buffers, once their dtypes are known."""
        size = (math.prod(lp.size for lp in self.k.inner) * 8 + 63) // 64 * 64
        out, stack = [], self.k.row_stack
        for v in (v for p in self.k.passes for v in p.buffered):
            ct = COMPUTE_TYPE[self.dtypes.get(v, DType.F32)]
            heap = f"({ct}*)std::aligned_alloc(64, {size})"
            if not stack:
                out.append(f"{ct}* __restrict rb_{v} = {heap};" if alloc else f"std::free(rb_{v});")
            elif alloc:  # `Kernel.row_stack`: rows that fit take no allocation per call
                out.append(f"alignas(64) char rb_{v}_st[{stack}];")
                out.append(f"{ct}* __restrict rb_{v} = {size} <= {stack} ? ({ct}*)rb_{v}_st : {heap};")
            else:
                out.append(f"if ((char*)rb_{v} != rb_{v}_st) std::free(rb_{v});")
        return out

    def describe(self) -> str:
        outer = "x".join(str(lp.size) for lp in self.k.outer) or "-"
        inner = "x".join(str(lp.size) for lp in self.k.inner) or "-"
        return f"rows {outer}, row {inner}, {len(self.k.passes)} pass(es)"


class StatementWriter(KernelWriter):
    """Renders loose statements (a contraction's epilogue) whose loop variables are the C++
    expressions in `names` rather than loops of a kernel."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.dtypes = {}
        self.lines = []
        self._depth = 0
        self._recips = {}
        self._nonpos = frozenset()
        self._fmas = {}
        self._made = 0
        self._exact = set()
        self.unclamped = None
        self.range = None
        self.fault = NO_FAULT  # the schedule keeps fault sites out of contraction templates
