"""Where GEMM B operands packed once live: the arena's persistent region (`ContractionKernel.prepacked_b`).

Why the arena and not a static buffer in the library: libraries are cached and shared by source
text, and the source does not hold the weights, so two models of the same architecture would
share a static buffer. The arena belongs to one executor (one set of frozen weights). The
region follows the fault record; the intermediates' part is reused by every kernel of a call,
this one is never written after a kernel's first call. Each kernel's slot is a 64-byte header
(an int state: 0 unpacked, 1 packing, 2 ready; zeroed when the arena is allocated) then
K x NPAD floats (NPAD: N rounded up to whole NR slivers), laid out per KC block: the block
starting at row pc is at pc * NPAD, its sliver at column j at j * kc inside it, i.e. the
driver's per-call panel layout for every (jc, pc) at once.
"""

from __future__ import annotations

from vfuse.codegen.cpp.faults import FAULT_BYTES, fault_offset
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel, Program

HEADER = 64


def _align(x: int) -> int:
    return (x + 63) // 64 * 64


def padded_n(n: int, nr: int) -> int:
    return -(-n // nr) * nr


def prepack_bytes(k: ContractionKernel) -> int:
    """Header plus K x NPAD floats of one kernel's packed B (a conv: its weight, OCg rounded up to MR
    rows of K per group); the int8 dot product (`int8.py`):
    header, NPAD x ceil(K / 4) x 4 bytes of W (to 64) and NPAD int32 column sums."""
    if k.op is Op.CONV2D:  # the weight as the conv templates pack it (gemm/conv_prepack.py)
        o, cg, kh, kw = k.shapes[1]
        groups = k.attrs["groups"]
        return _align(HEADER + 4 * groups * padded_n(o // groups, k.mr) * cg * kh * kw)
    kk, n = k.shapes[0][-1], k.out_shape[-1]
    if k.int8 is not None:
        npad = padded_n(n, k.int8.nr)
        return _align(HEADER + _align(npad * ((kk + 3) // 4) * 4) + 4 * npad)
    return _align(HEADER + 4 * kk * padded_n(n, k.nr))


def prepack_layout(program: Program) -> tuple[dict[str, int], int, int]:
    """(each prepacking kernel's slot offset in the arena, the region's start, its end = arena bytes)."""
    start = _align(fault_offset(program) + FAULT_BYTES)
    offsets, at = {}, start
    for k in program.kernels:
        if isinstance(k, ContractionKernel) and k.prepacked_b:
            offsets[k.name] = at
            at += prepack_bytes(k)
    return offsets, start, at


# One thread packs on the first call; any other that arrives meanwhile waits for it (a second
# executor call cannot overlap today, the executor holds a lock, but the kernel does not rely on it).
PREPACK_ONCE = r"""
#ifndef VFUSE_PREPACK_ONCE
#define VFUSE_PREPACK_ONCE
static inline bool vg_prepack_claim(int* state) {
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) == 2) return false;
  int expected = 0;
  if (__atomic_compare_exchange_n(state, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return true;
  while (__atomic_load_n(state, __ATOMIC_ACQUIRE) != 2) {
  }
  return false;
}
static inline void vg_prepack_done(int* state) { __atomic_store_n(state, 2, __ATOMIC_RELEASE); }
#endif
"""
