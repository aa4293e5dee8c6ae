"""Cache blocks of a GEMM whose A is read transposed (a weight gradient dW = dY^T X): all of M in
one row block.

`choose_blocking` runs K up to 1280 (or in blocks of 1024) in one block once C's passes would go to
DRAM (measured faster on forward GEMMs). A weight gradient's K is the token count and its C (the
weight) is small, and two things there differ: its A packer reads one run of a source row per K
step, each step a row (often a page) from the last, so an MC block of 60 rows walked every source
row M / 60 times; and with several row blocks the threads share each K block's B panel, two
barriers per K block (under load each waits on a preempted thread). With M in one block (A about
half of L2, KC down to 32) each step reads whole rows and each thread packs its own B slivers
(driver.py `_own_slivers`): 256 x 2048 x 1024 and 1024 x 2048 x 256 ran 1.12-1.33x and 1.04-1.14x
torch at one thread, 0.97-1.03x and 0.89-0.92x after; at two threads (CPU time, loaded) 1.2-1.3x ->
0.6-0.8x (AVX2, Zen 3; the L1-KC alternative, MC 168 at KC 352, was 1.7x torch there).
"""

from __future__ import annotations

import dataclasses
import math

from vfuse.ir import Op
from vfuse.ir.sym import is_sym
from vfuse.schedule.blocks import Blocking, CallBlocks, shared_a
from vfuse.schedule.kernel import ContractionKernel
from vfuse.schedule.microtile import Tile, VectorUnit


def l1_kc(l1_bytes: int, nr: int) -> int:
    """The KC whose KC x NR B sliver fills 3/4 of L1 (a multiple of 16), as `choose_blocking`'s."""
    return max(16, (3 * l1_bytes // 4) // (4 * nr) // 16 * 16)


# Below this KC the C tile's read and write per micro-kernel call (and per K block) cost more than
# one row block saves: M too large for one block; `choose_blocking` decides then.
MIN_KC = 32


def transposed_a(k: ContractionKernel) -> bool:
    """A MATMUL whose A is computed by a prologue contiguous along its rows (dY^T read in place)."""
    pro = k.prologue(0)
    return k.op is Op.MATMUL and pro is not None and pro.inner == -2


def transposed_a_blocks(k: ContractionKernel, tile: Tile, unit: VectorUnit) -> ContractionKernel:
    """`k` with all of M in one row block, K in equal blocks that keep the A block about half of L2
    (within the L1 KC), one column panel within half of L3, where A is read transposed, K is longer
    than one such block and the KC is at least MIN_KC (fixed sizes only)."""
    a = k.shapes[0]
    m, kk, n = a[-2], a[-1], k.out_shape[-1]
    if not transposed_a(k) or any(is_sym(d) for d in (*a, *k.out_shape)):
        return k
    mr, nr = tile
    mpad = -(-m // mr) * mr
    l1, l2, l3 = k.caches
    cap = min(l1_kc(l1, nr), ((l2 // 2) // (4 * mpad) + 8) // 16 * 16)  # to the nearest 16
    if cap < MIN_KC or kk <= cap:
        return k
    per = -(-kk // -(-kk // cap))  # equal blocks, a multiple of 16 within the cap
    kc = min(cap, -(-per // 16) * 16)
    nc = max(nr, min(-(-n // nr) * nr, (l3 // 2) // (4 * kc) // nr * nr))
    b = Blocking(mr, nr, mpad, kc, nc, unit.lanes)
    once = shared_a(m, n, kk, math.prod(k.out_shape[:-2]), b)
    return dataclasses.replace(k, gemm_blocks=CallBlocks(m, (b,)), shared_a=once)
