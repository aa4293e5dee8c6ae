"""Render a schedule `Program` as one C++ translation unit.

The renderer walks the kernels and fills small templates; what each op, dtype and reduction
becomes is in `rules.py`. Each kernel is a `static` function; each native segment gets an
`extern "C"` entry `int seg(void* const* bufs, char* arena, const int64_t* seeds, int nt)`
that runs its kernels in order (bufs: the program's pointer table of inputs, outputs and
torch-made tensors; arena: intermediates, then the fault record; seeds: RNG_SEED values; nt:
OpenMP threads) and returns 0, or the code of a fault (`faults.py`).
"""

from __future__ import annotations

import hashlib
import math
import re

import torch

from vfuse.codegen.cpp.columns import render_tiled
from vfuse.codegen.cpp.faults import FAULT_VAR, NO_FAULT, fault_compute, is_fault_site, kernel_prologue, render_entry
from vfuse.codegen.cpp.lanes import render_lanes, use_lanes
from vfuse.codegen.cpp.prefetch import RowPrefetch, plan_prefetch, render_prefetch
from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.rowfacts import below_row_max, pass_invariant_divisors
from vfuse.codegen.cpp.rowgroups import render_row_groups, use_row_groups
from vfuse.codegen.cpp.rules import (
    COMPUTE_TYPE,
    CPP_RULES,
    FAULT_RULES,
    LOAD_CONVERT,
    NAN_TRACKED,
    REDUCE_RULES,
    STORAGE_TYPE,
    STORE_CONVERT,
)
from vfuse.codegen.cpp.streaming import render_streamed
from vfuse.codegen.cpp.strips import render_strips, strip_chains
from vfuse.ir import DType, Op
from vfuse.schedule import expr
from vfuse.schedule.kernel import (
    Buffer,
    BufKind,
    Compute,
    Const,
    ContractionKernel,
    Iota,
    Kernel,
    Load,
    Loop,
    Pass,
    Program,
    Rand,
    RandKey,
    Reduce,
    Select,
    Stmt,
    Store,
)

BLOCK = 1024  # elements per partial sum: bounds float rounding error of long sums


def block_length(size: int) -> int | None:
    """The length of every BLOCK of a `size`-long reduction where they are all the same."""
    return min(size, BLOCK) if size <= BLOCK or size % BLOCK == 0 else None


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
        self.depth = 1
        self.prefetch: RowPrefetch | None = None  # set by rows() where it prefetches
        self.recips: dict[str, str] = {}  # divisors of the current pass -> their 1/d's variable
        self.nonpos: frozenset[str] = frozenset()  # values of the current pass known <= 0 or NaN
        self.fault = FAULT_VAR  # where integer divisions report division by zero
        self.made = 0  # helper variables named so far (`fresh`)

    def w(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def fresh(self, base: str) -> str:
        """A variable name no other line of this function declares: passes of a row share one
        scope, so a helper named only after its IR value (t3_rcp) was declared twice when two
        passes both needed it."""
        self.made += 1
        return f"{base}_{self.made}"

    def idx(self, e: expr.Lin) -> str:
        return expr.render(e, self.names)

    # ---- statements ----
    def stmt(self, s: Stmt | Store) -> None:
        if isinstance(s, Store):
            conv = STORE_CONVERT.get(s.dtype, "{0}").format(s.arg)
            self.w(f"{pointer(s.buf)}[{self.idx(s.index)}] = {conv};")
            return
        if isinstance(s, RandKey):
            self.w(f"const vf_key {s.var} = vf_rand_key({s.seed}, {s.stream});")
            return
        dtype = DType.F32 if isinstance(s, Rand) else s.dtype
        self.dtypes[s.var] = dtype
        self.w(f"const {COMPUTE_TYPE[dtype]} {s.var} = {self.value(s)};")

    def value(self, s: Stmt) -> str:
        if isinstance(s, Load):
            return LOAD_CONVERT.get(s.dtype, "{0}").format(f"{pointer(s.buf)}[{self.idx(s.index)}]")
        if isinstance(s, Const):
            return literal(s.value, s.dtype)
        if isinstance(s, Iota):
            return self.iota(s)
        if isinstance(s, Rand):
            return f"vf_rand({s.key}, (uint64_t)({self.idx(s.index)}))"
        if isinstance(s, Select):
            c = self.idx(s.coord)
            out = s.args[-1]
            for b, a in reversed(list(zip(s.bounds, s.args, strict=False))):
                out = f"(({c}) < {b} ? {a} : {out})"
            return out
        assert isinstance(s, Compute)
        if s.op is Op.DIV and s.args[1] in self.recips:
            return f"({s.args[0]} * {self.recips[s.args[1]]})"
        if s.op is Op.EXP and s.args[0] in self.nonpos:
            return f"vf_exp_nonpos({s.args[0]})"
        if is_fault_site(s) and s.op in FAULT_RULES:
            return fault_compute(s, self.fault)
        ct = COMPUTE_TYPE[s.dtype]
        expr = CPP_RULES[s.op].format(*s.args, T=ct, **dict(s.attrs.items()))
        if s.op is Op.CAST and s.dtype in STORE_CONVERT:
            # fp16/bf16 are computed in fp32, but an explicit cast must round like torch does.
            return LOAD_CONVERT[s.dtype].format(STORE_CONVERT[s.dtype].format(expr))
        return expr

    def iota(self, s: Iota) -> str:
        ct = COMPUTE_TYPE[s.dtype]
        i = self.idx(s.index)
        if s.dtype.is_float:
            return f"({ct})((double){float(s.start)!r} + (double){float(s.step)!r} * (double)({i}))"
        return f"({ct})({int(s.start)}LL + {int(s.step)}LL * ({i}))"

    # ---- reductions ----
    def acc_type(self, r: Reduce) -> str:
        return COMPUTE_TYPE[r.arg_dtype if r.op in (Op.ARGMAX, Op.ARGMIN) else r.dtype]

    def declare_acc(self, r: Reduce, name: str, size: int = 0) -> None:
        """A scalar accumulator, or with `size` an array of them (one per column of a tile)."""
        init = REDUCE_RULES[r.op][0].format(T=self.acc_type(r))
        arr, at = (f"[{size}]", "[c]") if size else ("", "")
        self.w(f"{self.acc_type(r)} {name}{arr};")
        if self.tracks_nan(r):
            self.w(f"int {name}_nan{arr};")
        if r.op in (Op.ARGMAX, Op.ARGMIN):
            self.w(f"int64_t {name}_idx{arr};")
        if size:
            self.w(f"for (int64_t c = 0; c < {size}; ++c) {{")
        self.w(f"{'  ' if size else ''}{name}{at} = {init};")
        if self.tracks_nan(r):
            self.w(f"{'  ' if size else ''}{name}_nan{at} = 0;")
        if r.op in (Op.ARGMAX, Op.ARGMIN):
            self.w(f"{'  ' if size else ''}{name}_idx{at} = 0;")
        if size:
            self.w("}")

    def tracks_nan(self, r: Reduce) -> bool:
        return r.op in NAN_TRACKED and r.dtype.is_float

    def update(self, r: Reduce, name: str, at: str = "") -> None:
        x = r.arg
        if r.op is Op.ANY or r.op is Op.ALL or r.arg_dtype is r.dtype or r.op in (Op.ARGMAX, Op.ARGMIN):
            pass
        else:
            x = f"({self.acc_type(r)}){x}"
        acc = f"{name}{at}"
        self.w(REDUCE_RULES[r.op][1].format(acc=acc, x=x, idx=f"{name}_idx{at}", r=self.idx(r.rindex)))
        if self.tracks_nan(r):
            self.w(f"{name}_nan{at} |= ({r.arg} != {r.arg});")

    def clauses(self, reduces: tuple[Reduce, ...], suffix: str) -> str:
        out = []
        for r in reduces:
            op = REDUCE_RULES[r.op][2]
            out.append(f"reduction({op}:{r.var}{suffix})")
            if self.tracks_nan(r):
                out.append(f"reduction(|:{r.var}{suffix}_nan)")
        return " ".join(out)

    def combine(self, r: Reduce, part: str, at: str = "") -> None:
        self.w(REDUCE_RULES[r.op][3].format(acc=f"{r.var}_acc{at}", part=f"{part}{at}"))
        if self.tracks_nan(r):
            self.w(f"{r.var}_acc_nan{at} |= {part}_nan{at};")

    def finish(self, r: Reduce, at: str = "") -> None:
        acc = f"{r.var}_acc"
        ct = COMPUTE_TYPE[r.dtype]
        if r.op in (Op.ARGMAX, Op.ARGMIN):
            val = f"{acc}_idx{at}"
        elif self.tracks_nan(r):
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
        self.w(f"for (int64_t {v} = {start}; {v} < {end or lp.size}; ++{v}) {{")
        self.depth += 1

    def close(self, n: int = 1) -> None:
        for _ in range(n):
            self.depth -= 1
            self.w("}")

    def parallel_clause(self) -> str:
        return "num_threads(nt) schedule(static)"

    @property
    def threaded(self) -> bool:
        """Whether the kernel is big enough to fork threads. Decided here, not with an OpenMP
        `if(...)` clause: g++ stops vectorizing a `parallel for simd` whose `if` folds to false."""
        return self.total() >= self.k.parallel_min

    def total(self) -> int:
        return math.prod(lp.size for lp in (*self.k.outer, *self.k.inner))

    def pass_(self, p: Pass) -> None:
        for s in p.before:
            self.stmt(s)
        self.row_facts(p)
        for r in p.reduces:
            self.declare_acc(r, f"{r.var}_acc")
        loops = list(self.k.inner)
        serial = bool(self.k.outer) or not self.threaded or any(r.op in (Op.ARGMAX, Op.ARGMIN) for r in p.reduces)
        if not loops:
            self.body(p, "_acc")
        else:
            self.nest(p, loops, serial)
        for r in p.reduces:
            self.finish(r)
        self.recips, self.nonpos = {}, frozenset()

    def row_facts(self, p: Pass) -> None:
        """Hoist the reciprocals of `p`'s pass-invariant divisors; note its values known to
        be <= 0 (rowfacts.py)."""
        self.recips = {d: self.fresh(f"{d}_rcp") for d in sorted(pass_invariant_divisors(self.k, p))}
        for d, name in self.recips.items():
            self.w(f"const float {name} = 1.0f / (float){d};")
        self.nonpos = below_row_max(self.k, p)

    def nest(self, p: Pass, loops: list[Loop], serial: bool) -> None:
        if self.k.stream and any(isinstance(s, Store) for s in p.body):
            render_streamed(self, p, loops, serial)
            return
        *rest, vec = loops
        par = [lp for lp in rest if lp.parallel and not serial]
        if par:
            collapse = f" collapse({len(par)})" if len(par) > 1 else ""
            self.w(f"#pragma omp parallel for {self.parallel_clause()}{collapse} {self.clauses(p.reduces, '_acc')}")
        for lp in rest:
            self.open_loop(lp)
        arg = any(r.op in (Op.ARGMAX, Op.ARGMIN) for r in p.reduces)
        vec_par = vec.parallel and not serial
        if p.reduces and not arg:
            self.blocked(p, vec, vec_par, whole_row=not rest)
        else:
            if not arg:
                pragma = f"parallel for simd {self.parallel_clause()}" if vec_par else "simd"
                self.w(f"#pragma omp {pragma}")
            self.open_loop(vec)
            self.body(p, "_acc")
            self.close()
        self.close(len(rest))

    def blocked(self, p: Pass, vec: Loop, parallel: bool, whole_row: bool) -> None:
        """A SIMD reduction loop in blocks of BLOCK elements whose partials are then combined.
        `whole_row`: `vec` is the pass's only loop (no other reduced loop encloses it)."""
        if whole_row and not parallel and vec.size <= BLOCK and use_lanes(p, vec, self.tracks_nan):
            # One block that is the whole row: the folded lanes are the row's result. Combining
            # them into the identity (twice: block, then row) put two dependent adds on every
            # row's chain (LayerNorm 8192x256, 1 thread: -5 %); only the sign of a zero sum can
            # differ. Inside another reduced loop the lanes are one partial among several.
            self.w("{")
            self.depth += 1
            self.w(f"const int64_t rb = 0, re = {vec.size};")
            render_lanes(self, p, vec, "_acc")
            self.close()
            return
        if parallel:
            self.w(f"#pragma omp parallel for {self.parallel_clause()} {self.clauses(p.reduces, '_acc')}")
        length = block_length(vec.size)
        self.w(f"for (int64_t rb = 0; rb < {vec.size}; rb += {BLOCK}) {{")
        self.depth += 1
        self.w(f"const int64_t re = rb + {BLOCK} < {vec.size} ? rb + {BLOCK} : {vec.size};")
        if use_lanes(p, vec, self.tracks_nan):
            for r in p.reduces:
                self.declare_acc(r, f"{r.var}_blk")
            render_lanes(self, p, vec, "_blk")
        elif chains := strip_chains(self.k, p, vec, length, parallel, self.prefetch is not None):
            for r in p.reduces:
                self.declare_acc(r, f"{r.var}_blk")
            render_strips(self, p, vec, chains, min(vec.size, BLOCK))
        else:
            for r in p.reduces:
                self.declare_acc(r, f"{r.var}_blk")
            self.w(f"#pragma omp simd {self.clauses(p.reduces, '_blk')}")
            self.open_loop(vec, "rb", "re")
            self.body(p, "_blk")
            self.close()
        for r in p.reduces:
            self.combine(r, f"{r.var}_blk")
        self.close()

    # ---- the function ----
    def pointers(self) -> None:
        stored = {s.buf for p in self.k.passes for s in p.body if isinstance(s, Store)}
        stored |= {s.buf for s in self.k.after if isinstance(s, Store)}
        for v in self.k.buffers:
            self.w(pointer_line(v, self.program.buffers[v], v in stored))

    def row_buffers(self, alloc: bool) -> None:
        n = math.prod(lp.size for lp in self.k.inner)
        for p in self.k.passes:
            for v in p.buffered:
                ct = COMPUTE_TYPE[self.dtypes.get(v, DType.F32)]
                if alloc:
                    size = (n * 8 + 63) // 64 * 64
                    self.w(f"{ct}* __restrict rb_{v} = ({ct}*)std::aligned_alloc(64, {size});")
                else:
                    self.w(f"std::free(rb_{v});")

    def function(self) -> str:
        self.pointers()
        for line in kernel_prologue(self.k, self.program):
            self.w(line)
        if self.k.tile:
            render_tiled(self)
        elif self.k.outer:
            self.rows()
        else:
            # One row: its buffer is shared; each parallel pass loop ends with a barrier.
            at = len(self.lines)
            for p in self.k.passes:
                self.pass_(p)
            for s in self.k.after:
                self.stmt(s)
            body, self.lines = self.lines[at:], self.lines[:at]
            self.row_buffers(True)
            self.lines += body
            self.row_buffers(False)
        head = f"static void {self.k.name}(void* const* bufs, char* arena, const int64_t* seeds, int nt) {{"
        doc = f"// group {self.k.group} ({self.k.label}): {self.describe()}"
        return "\n".join([doc, head, *self.lines, "}"])

    def rows(self) -> None:
        if self.threaded:
            self.w("#pragma omp parallel num_threads(nt)")
        self.w("{")
        self.depth += 1
        at = len(self.lines)
        collapse = f" collapse({len(self.k.outer)})" if len(self.k.outer) > 1 else ""
        if self.threaded:
            # A streaming kernel's threads fence their own stores before the region's barrier.
            nowait = " nowait" if self.k.stream else ""
            self.w(f"#pragma omp for schedule(static){nowait}{collapse}")
        if use_row_groups(self.k):
            render_row_groups(self)
        else:
            self.prefetch = plan_prefetch(self.k)
            for lp in self.k.outer:
                self.open_loop(lp)
            for i, p in enumerate(self.k.passes):
                if self.prefetch:
                    render_prefetch(self, self.prefetch, i, len(self.k.passes))
                self.pass_(p)
            for s in self.k.after:
                self.stmt(s)
            self.close(len(self.k.outer))
        if self.k.stream:
            self.w("vf_stream_fence();")
        # Row buffers are declared now that the statements' dtypes are known.
        body, self.lines = self.lines[at:], self.lines[:at]
        self.row_buffers(True)
        self.lines += body
        self.row_buffers(False)
        self.close()

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
        self.depth = 0
        self.recips = {}
        self.nonpos = frozenset()
        self.made = 0
        self.fault = NO_FAULT  # the schedule keeps fault sites out of contraction templates


def render_kernel(kernel: Kernel, program: Program) -> str:
    if kernel.table:
        from vfuse.codegen.cpp.table import render_table  # it builds on this module

        return render_table(kernel, program)
    return KernelWriter(kernel, program).function()


def render(program: Program) -> str:
    """The whole translation unit: prelude, template instances (GEMM / conv / attention, each
    include-guarded or namespaced), every kernel, one entry per segment."""
    from vfuse.codegen.cpp.contraction import render_contraction  # it builds on this module

    parts, kernels = [PRELUDE], []
    for k in program.kernels:
        if isinstance(k, ContractionKernel):
            template, wrapper = render_contraction(k, program)
            parts.append(template)
            kernels.append(wrapper)
        else:
            kernels.append(render_kernel(k, program))
    parts += kernels
    parts += [render_entry(seg, program) for seg in program.segments]
    return "\n\n".join(parts) + "\n"
