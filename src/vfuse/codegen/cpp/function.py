"""The frame of every kernel function and of the segment entries: signature, buffer pointers,
the fault prologue (`faults.py`), then the body a walk's renderer writes."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.codegen.cpp.faults import FAULT_VAR, c_string, can_fault, fault_offset
from vfuse.codegen.cpp.prefetch import PREFETCH_FLAG, PREFETCH_ROWS
from vfuse.codegen.cpp.streaming import STREAM_FLAG
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.ir.sym import is_sym
from vfuse.schedule.kernel import LINE, Kernel, Program, Segment, SizeGate

SIGNATURE = "(void* const* bufs, char* arena, const int64_t* seeds, int nt)"
NO_PRE = "no-tree-pre"  # Kernel.no_pre: g++ only (clang ignores the attribute)
NO_JUMP_THREADING = "no-thread-jumps"  # Kernel.no_jump_threading
NARROW_SIMD = '__attribute__((target("prefer-vector-width=256")))'  # Kernel.narrow_simd (x86 only)
PROFILED_SUFFIX = "_prof"  # the timing entry of segment `s` is `s_prof(..., int64_t* ns)`


def kernel_function(w: KernelWriter, body: Callable[[KernelWriter], None]) -> str:
    """`static void kN(...)`: pointers, fault prologue, then `body(w)`."""
    w.pointers()
    for line in (*kernel_prologue(w.k, w.program), *stream_flag(w.k), *thread_gate(w.k), *prefetch_gate(w.k)):
        w.w(line)
    body(w)
    doc = f"// group {w.k.group} ({w.k.label}): {w.describe()}"
    return "\n".join([doc, *_attributes(w.k), f"static void {w.k.name}{SIGNATURE} {{", *w.lines, "}"])


def condition(gate: SizeGate) -> str:
    """The C++ test of a per-call choice (`schedule.gates.SizeGate`) over this call's sizes."""
    return gate.text(
        lambda moved, limit: f"(int64_t)({moved}) >= (int64_t){limit}LL",
        lambda a: f"(int64_t)({a}) % {LINE} == 0",
        " && ",
        " || ",
    )


def stream_flag(k: Kernel) -> list[str]:
    """The kernel's first line when it streams per call: whether this call's sizes pass the
    gate (`Kernel.stream_gate`: its bytes, `schedule.nest.StreamGate`); none for a fixed choice."""
    gate = k.stream_gate
    return [] if gate is None else [f"const bool {STREAM_FLAG} = {condition(gate)};"]


def thread_gate(k: Kernel) -> list[str]:
    """One thread for this call when its sizes give fewer loop points than the schedule's gate
    (`Kernel.thread_gate`: symbolic sizes whose range holds both); none for a fixed choice."""
    gate = k.thread_gate
    if gate is None:
        return []
    if gate.single:
        return [f"if ((int64_t)({gate.moved}) < (int64_t){gate.limit}LL) nt = 1;"]
    return [f"if (!({condition(gate)})) nt = 1;"]


def prefetch_gate(k: Kernel) -> list[str]:
    """The rows ahead this call prefetches and whether it prefetches at all, where the schedule
    left them to the call's sizes (`RowPrefetch.distance` a size, `RowPrefetch.gate`)."""
    pf = k.prefetch
    if pf is None:
        return []
    lines = [f"const int64_t {PREFETCH_ROWS} = (int64_t)({pf.distance});"] if is_sym(pf.distance) else []
    return lines + ([f"const bool {PREFETCH_FLAG} = {condition(pf.gate)};"] if pf.gate is not None else [])


def _attributes(k: Kernel) -> list[str]:
    opts = [f'"{o}"' for o, on in ((NO_PRE, k.no_pre), (NO_JUMP_THREADING, k.no_jump_threading)) if on]
    attrs = [f"__attribute__((optimize({', '.join(opts)})))"] if opts else []
    return attrs + ([NARROW_SIMD] if k.narrow_simd else [])


def kernel_prologue(k: Kernel, program: Program) -> list[str]:
    """The first lines of a kernel that can fault: `vf_f`, then one check per index buffer
    (before any loop, so a bad index returns before anything is read with it)."""
    if not can_fault(k):
        return []
    lines = [f"vf_fault* const {FAULT_VAR} = (vf_fault*)(arena + {fault_offset(program)});", f"(void){FAULT_VAR};"]
    for c in k.checks:
        m, lo = program.buffers[c.buf].type.numel, -c.rows if c.wrap else 0
        check = f"vf_check_rows({pointer(c.buf)}, {m}, {lo}, {c.rows}, {FAULT_VAR}, {c_string(c.node)})"
        lines.append(f"if (!{check}) return;")
    return lines


def render_entry(seg: Segment, program: Program) -> str:
    """`extern "C" int seg(...)`: runs the kernels in order; 0, or the code of the first fault."""
    body = []
    if any(can_fault(k) for k in seg.kernels):
        body.append(f"vf_fault* const {FAULT_VAR} = (vf_fault*)(arena + {fault_offset(program)});")
        body.append(f"{FAULT_VAR}->code = VF_OK;")
    for k in seg.kernels:
        body.append(f"{k.name}(bufs, arena, seeds, nt);")
        if can_fault(k):
            body.append(f"if ({FAULT_VAR}->code != VF_OK) return (int){FAULT_VAR}->code;")
    body.append("return 0;")
    head = f'extern "C" int {seg.name}{SIGNATURE} {{'
    return "\n".join([head, *(f"  {line}" for line in body), "}"])


def render_profiled_entry(seg: Segment, program: Program) -> str:
    """`extern "C" int seg_prof(..., int64_t* ns)`: as the entry, and ns[i] = the monotonic-clock
    nanoseconds kernel i of the segment took (a profiled Program only)."""
    body = ["timespec vf_t0, vf_t1;"]
    if any(can_fault(k) for k in seg.kernels):
        body.append(f"vf_fault* const {FAULT_VAR} = (vf_fault*)(arena + {fault_offset(program)});")
        body.append(f"{FAULT_VAR}->code = VF_OK;")
    for i, k in enumerate(seg.kernels):
        body.append("clock_gettime(CLOCK_MONOTONIC, &vf_t0);")
        body.append(f"{k.name}(bufs, arena, seeds, nt);")
        body.append("clock_gettime(CLOCK_MONOTONIC, &vf_t1);")
        body.append(f"ns[{i}] = (vf_t1.tv_sec - vf_t0.tv_sec) * 1000000000LL + (vf_t1.tv_nsec - vf_t0.tv_nsec);")
        if can_fault(k):
            body.append(f"if ({FAULT_VAR}->code != VF_OK) return (int){FAULT_VAR}->code;")
    body.append("return 0;")
    head = f'extern "C" int {seg.name}{PROFILED_SUFFIX}{SIGNATURE[:-1]}, int64_t* ns) {{'
    return "\n".join([head, *(f"  {line}" for line in body), "}"])
