"""A conv weight that is a constant (a frozen parameter) packed once, not on every call.

Why: both conv paths pack the OIHW weight into MR-row slivers before their micro-kernels run; for
a frozen weight that pass is the same on every call (a strided read and a write of the whole
weight: ~10 % of a 256 -> 256 channel 3x3 conv on 8x8 planes, AVX2). The schedule marks such a
conv (`ContractionKernel.prepacked_b`: operand 1, the weight, is constant) and the entry then
takes `char* vg_pre`, its slot of the arena's persistent region (`gemm/prepack.py`: a 64-byte
header whose state the first call claims, then groups x K x OCg rounded up to MR floats, the
layout of either path's per-call pack). As for GEMMs, changing a frozen weight in place after
compiling is unspecified (docs/semantics.md).
"""

from __future__ import annotations

from vfuse.codegen.cpp.gemm.prepack import HEADER, PREPACK_ONCE

__all__ = ["PREPACK_ONCE", "packed_floats", "prepack_param", "weight_once"]


def packed_floats(groups: int, ocg: int, k: int, mr: int) -> int:
    """Floats of a packed weight: per group, OCg rounded up to MR rows of K (= Cg x KH x KW)."""
    return groups * -(-ocg // mr) * mr * k


def prepack_param(prepack: bool) -> str:
    """The entry's parameter for the arena slot of a weight packed once (empty otherwise)."""
    return ", char* __restrict vg_pre" if prepack else ""


def weight_once(pack: str) -> str:
    """C++ statements: `ap`, the weight packed once into the arena slot `vg_pre` by the statement
    `pack` (which writes `ap`) on the first call; later calls, and a thread arriving meanwhile
    (it waits), only read it."""
    return f"""  float* const ap = reinterpret_cast<float*>(vg_pre + {HEADER});
  if (vg_prepack_claim(reinterpret_cast<int*>(vg_pre))) {{
    {pack}
    vg_prepack_done(reinterpret_cast<int*>(vg_pre));
  }}
"""
