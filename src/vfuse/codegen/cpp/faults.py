"""Faults: how generated code reports what eager torch raises for (a gather's index out of
range, an integer division by zero) instead of reading out of bounds or trapping.

The fault record (`vf_fault` in the prelude: code, node, value, bound) lives in the arena just
past the intermediates (`fault_offset`), so each executor has its own. A kernel that can fault
points `vf_f` at it, checks the index buffer of each of its gathers before its loops
(`vf_check_rows`: one vectorized min/max pass; on a bad index it records it and returns), and
passes `vf_f` to its integer divisions, which record a division by zero and go on with 0 (no
throwing out of OpenMP loops). The segment entry clears the record and returns its code after
each such kernel (both written by `function.py`); the runtime raises the matching exception
naming the node (runtime/native.py), and nothing computed after a fault is returned.
"""

from __future__ import annotations

from collections.abc import Iterator

from vfuse.codegen.cpp.rules import FAULT_RULES
from vfuse.ir import Op
from vfuse.schedule.kernel import AnyKernel, Compute, ContractionKernel, Kernel, Program

FAULT_BYTES = 32  # struct vf_fault
FAULT_VAR = "vf_f"
NO_FAULT = "nullptr"  # where no fault can happen (a lookup table's fill: divisors are constants)
CODES = {1: "index", 2: "zero_division"}  # VF_INDEX, VF_ZERO_DIV


def fault_offset(program: Program) -> int:
    """The record's byte offset in the arena (after every intermediate, 64-byte aligned)."""
    return (program.memory.size + 63) // 64 * 64


def c_string(s: str) -> str:
    """`s` as a C string literal (IR names are identifiers, but nothing here relies on it)."""
    keep = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
    return '"' + "".join(chr(b) if b in keep else f"\\{b:03o}" for b in s.encode()) + '"'


def is_fault_site(s: object) -> bool:
    """A statement that can fault: an integer division (gathers are checked before the loops)."""
    return isinstance(s, Compute) and s.op in FAULT_RULES and not s.dtype.is_float


def _computes(k: Kernel) -> Iterator[Compute]:
    for p in k.passes:
        for s in (*p.before, *p.body):
            if isinstance(s, Compute):
                yield s
    for s in k.after:
        if isinstance(s, Compute):
            yield s


def can_fault(k: AnyKernel) -> bool:
    # Contraction templates have no fault record (the schedule keeps fault sites out of them),
    # except SCATTER_ADD, which checks its indices as it reads them (codegen/cpp/scatter.py).
    if isinstance(k, ContractionKernel):
        return k.op is Op.SCATTER_ADD
    return bool(k.checks) or any(is_fault_site(s) for s in _computes(k))


def fault_compute(s: Compute, fault: str) -> str:
    """An integer division reporting division by zero into `fault`."""
    return FAULT_RULES[s.op].format(*s.args, fault=fault, node=c_string(s.attrs["node"]))
