"""The Triton code writer: lines and scopes of one `@jit` function, and one line per statement.

Every value is a Triton tensor of its compute type (`names.COMPUTE`); per-row values broadcast
against per-element ones. Loads whose index moves with a loop are masked by the scope's mask
(`mask`); a gathered row index (`Dyn`) is clamped into its buffer, so an index the check kernel
reports as out of range never reads outside memory. Faults go to the program's fault record
(`FaultTable`): a slot per site, holding the smallest offending position (INT64_MAX: none).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vfuse.codegen.triton.names import COMPUTE, WIDEN_FP8, IndexWriter, LoopGroup, literal, param
from vfuse.codegen.triton.ops import TritonUnsupported, compute, is_fault_site
from vfuse.ir import DType, Op
from vfuse.ir.defs.rng import GOLDEN, MASK32
from vfuse.schedule import expr
from vfuse.schedule.kernel import (
    BufKind,
    Compute,
    Const,
    Iota,
    Kernel,
    Load,
    Program,
    Rand,
    RandKey,
    Select,
    Stmt,
    Store,
    stmt_args,
)

INDENT = "    "
# What the seeds array and the fault record are bound as in a launch (no IR value has these names).
SEEDS, FAULTS = "<seeds>", "<faults>"


class FaultKind(enum.Enum):
    INDEX = "index"  # a gather index out of range: the slot holds its flat position in `buf`
    ZERO_DIVISION = "zero division"  # an integer division by zero: the slot holds 0


@dataclass(frozen=True)
class FaultSite:
    slot: int
    kind: FaultKind
    node: str  # the IR node the fault is reported for
    buf: str = ""  # INDEX: the index buffer
    rows: int = 0  # INDEX: the gathered dim's size
    wrap: bool = False  # INDEX: negative indices count from the end


@dataclass
class FaultTable:
    """Every fault site of a program, in launch order (the first one set is the one raised)."""

    sites: list[FaultSite] = field(default_factory=list)

    def add(self, kind: FaultKind, node: str, buf: str = "", rows: int = 0, wrap: bool = False) -> int:
        self.sites.append(FaultSite(len(self.sites), kind, node, buf, rows, wrap))
        return len(self.sites) - 1


class TritonWriter:
    """Writes one kernel function of `k`. `groups` are its loop groups (outer, inner)."""

    def __init__(self, k: Kernel, program: Program, faults: FaultTable, groups: Sequence[LoopGroup]) -> None:
        self.k, self.program, self.faults = k, program, faults
        self.lines: list[str] = []
        self.depth = 1
        self.index = IndexWriter(groups)
        self.mask: str | None = "m_"  # None: every lane valid (a FLAT kernel's full blocks)
        self.lanes = "(xf_ >= 0)"  # true in every lane, where a mask-free scope needs a mask's shape
        self.defined: set[str] = set()
        self.fault_slots: dict[str, int] = {}  # a statement rendered in two scopes records one slot
        self.recips: dict[str, str] = {}
        self.defs: dict[str, Stmt] = {}  # every statement of the kernel by var (for recomputation)
        for p in k.passes:
            for s in (*p.before, *p.body):
                if not isinstance(s, Store):
                    self.defs.setdefault(s.var, s)
        bufs = program.buffers
        self.seeds = any(bufs[v].kind is BufKind.SEED for v in k.buffers)
        self.uses_faults = bool(k.checks) or any(
            isinstance(s, Compute) and is_fault_site(s) for s in self.defs.values()
        )

    # ---- lines and scopes ----
    def w(self, line: str) -> None:
        self.lines.append(INDENT * self.depth + line)

    def mark(self) -> tuple[int, int]:
        return len(self.lines), self.depth

    def insert(self, at: tuple[int, int], lines: Iterable[str]) -> None:
        pos, depth = at
        self.lines[pos:pos] = [INDENT * depth + ln for ln in lines]

    def params(self) -> list[str]:
        bufs = self.program.buffers
        out = [param(v) for v in self.k.buffers if bufs[v].kind is not BufKind.SEED]
        return out + (["seeds"] if self.seeds else []) + (["faults"] if self.uses_faults else [])

    def param_values(self) -> list[str]:
        """What each parameter is bound to: a buffer's IR value, SEEDS or FAULTS."""
        bufs = self.program.buffers
        out = [v for v in self.k.buffers if bufs[v].kind is not BufKind.SEED]
        return out + ([SEEDS] if self.seeds else []) + ([FAULTS] if self.uses_faults else [])

    # ---- statements ----
    def emit(self, s: Stmt | Store) -> None:
        """`s` once per scope (a value several passes recompute is the same value)."""
        if isinstance(s, Store):
            self.store(s)
            return
        if s.var in self.defined:
            return
        self.defined.add(s.var)
        if isinstance(s, RandKey):
            seed = s.seed
            self.w(f"{s.var}_lo = _vf_key_lo({seed}, {(s.stream * GOLDEN) & MASK32})")
            self.w(f"{s.var}_hi = _vf_key_hi({seed}, {s.stream})")
            return
        if isinstance(s, Compute) and is_fault_site(s):
            if s.var not in self.fault_slots:
                self.fault_slots[s.var] = self.faults.add(FaultKind.ZERO_DIVISION, str(s.attrs["node"]))
            self.w(f"_vf_flag(faults + {self.fault_slots[s.var]}, {self.mask or self.lanes} & ({s.args[1]} == 0))")
        self.w(f"{s.var} = {self.value(s)}")

    def emit_with_deps(self, s: Stmt | Store) -> None:
        """`s` after any statement it reads that is not defined in scope yet (a value an earlier
        pass kept in its row buffer is recomputed: a looped row has no row buffer)."""
        self.emit_deps(s)
        self.emit(s)

    def emit_deps(self, s: Stmt | Store) -> None:
        for d in self._deps(s):
            if d not in self.defined and d in self.defs:
                self.emit_with_deps(self.defs[d])

    def _deps(self, s: Stmt | Store) -> list[str]:
        names = [s.arg] if isinstance(s, Store) else list(stmt_args(s))
        for e in _indices(s):
            names += sorted(expr.dyn_names(e))
        return names

    def value(self, s: Stmt) -> str:
        if isinstance(s, Load):
            return self.load(s)
        if isinstance(s, Const):
            return literal(s.value, s.dtype)
        if isinstance(s, Compute):
            if s.op is Op.DIV and s.args[1] in self.recips:
                return f"({s.args[0]} * {self.recips[s.args[1]]})"
            return compute(s, s.args, self.k.name)
        if isinstance(s, Iota):
            return self.iota(s)
        if isinstance(s, Rand):
            return f"_vf_rand({s.key}_lo, {s.key}_hi, {self.index.render(s.index)})"
        if isinstance(s, Select):
            c = self.index.render(s.coord)
            out = s.args[-1]
            for b, a in reversed(list(zip(s.bounds, s.args, strict=False))):
                out = f"tl.where(({c}) < {b}, {a}, {out})"
            return out
        raise TypeError(f"{self.k.name}: no Triton rendering for {type(s).__name__}")

    def load(self, s: Load) -> str:
        b = self.program.buffers[s.buf]
        if b.kind is BufKind.SEED:
            return f"tl.load(seeds + {b.slot})"
        idx = self.index.render(s.index)
        if expr.dyn_names(s.index):
            idx = f"tl.minimum(tl.maximum({idx}, 0), {max(b.type.numel - 1, 0)})"
        moves = bool(expr.var_ids(s.index) or expr.dyn_names(s.index))
        other = "0.0" if s.dtype.is_fp8 else "0"  # the interpreter casts no int array to fp8
        masked = moves and self.mask is not None
        text = f"tl.load({param(s.buf)} + {idx}" + (f", mask={self.mask}, other={other})" if masked else ")")
        if s.dtype is DType.F16:
            return f"{text}.to(tl.float32)"
        if s.dtype is DType.BF16:
            return f"_vf_bf2f({text})"
        if s.dtype.is_fp8:
            return f"{WIDEN_FP8[s.dtype]}({text})"
        return text

    def iota(self, s: Iota) -> str:
        i = self.index.render(s.index)
        if s.dtype.is_float:
            return f"({float(s.start)!r} + {float(s.step)!r} * ({i}).to(tl.float64)).to({COMPUTE[s.dtype]})"
        return f"({int(s.start)} + {int(s.step)} * ({i}).to(tl.int64)).to({COMPUTE[s.dtype]})"

    def store(self, s: Store) -> None:
        v = s.arg
        if s.dtype is DType.F16:
            v = f"{v}.to(tl.float16)"
        elif s.dtype is DType.BF16:
            v = f"_vf_f2bf({v})"
        elif s.dtype.is_fp8:  # the schedule keeps fp8 results in torch (schedule/fp8dot.py)
            raise TritonUnsupported(f"{self.k.name}: store of {s.dtype.value} %{s.buf}")
        idx = self.index.render(s.index)
        if not expr.var_ids(s.index):  # one element per row (or kernel): the pointer takes the mask's shape
            idx = f"{idx} + 0 * {self.mask or self.lanes}.to(tl.int32)"
        mask = f", mask={self.mask}" if self.mask is not None else ""
        self.w(f"tl.store({param(s.buf)} + {idx}, {v}{mask})")

    def hoist_recips(self, divisors: Sequence[str]) -> None:
        """The schedule's pass-invariant divisors (`Pass.recips`): x / d is x * (1/d)."""
        self.recips = {}
        for d in divisors:
            name = f"{d}_rcp"
            if name not in self.defined:
                self.w(f"{name} = 1.0 / {d}")
                self.defined.add(name)
            self.recips[d] = name


def _indices(s: Stmt | Store) -> list[expr.Lin]:
    for fld in ("index", "coord", "rindex"):
        if hasattr(s, fld):
            return [getattr(s, fld)]
    return []
