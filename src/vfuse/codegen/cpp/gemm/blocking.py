"""Cache blocking for the packed GEMM (Goto/BLIS loop order jc -> pc -> ic -> jr -> ir).

Why these sizes: the micro-kernel streams an MR x KC sliver of packed A and a KC x NR sliver of
packed B. The B sliver is reused by every MR-row sliver of the MC block, so it should stay in
L1 (or at worst L2); the MC x KC block of A is reused by every NR-column sliver, so it should
stay in L2; the KC x NC panel of B is shared by all threads and reused by every MC block, so it
should stay in the shared L3. A large KC matters too: C is read and rewritten once per KC step,
so ceil(K / KC) is the number of passes over C.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.schedule.microtile import AVX512, VectorUnit, micro_tiles, pick_micro_tile


@dataclass(frozen=True, slots=True)
class Blocking:
    """Tile sizes in elements. mr x nr is the register tile of `lanes`-wide fp32 vectors (nr whole vectors)."""

    mr: int
    nr: int
    mc: int
    kc: int
    nc: int
    lanes: int = 16

    def __post_init__(self) -> None:
        if min(self.mr, self.nr, self.mc, self.kc, self.nc, self.lanes) < 1 or self.nr % self.lanes:
            raise ValueError(f"bad blocking {self}: sizes must be positive and nr a multiple of lanes")


# AVX-512's register tiles (the default unit); the schedule picks per target (schedule/microtile.py).
MICRO_TILES: tuple[tuple[int, int], ...] = micro_tiles(AVX512)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _split(k: int, cap: int) -> int:
    """A KC <= cap (roughly) that cuts k into equal blocks, a multiple of 16 unless it is k itself."""
    if k <= cap:
        return k
    blocks = -(-k // cap)
    return min(k, _round_up(-(-k // blocks), 16))


def choose_blocking(
    m: int,
    n: int,
    k: int,
    l1_bytes: int,
    l2_bytes: int,
    l3_bytes: int,
    micro: tuple[int, int] | None = None,
    unit: VectorUnit = AVX512,
) -> Blocking:
    """Tile sizes for an m x k @ k x n fp32 GEMM from per-core L1/L2 and shared L3 sizes.

    Two regimes, because extra K blocks cost a read-modify-write pass over the C panel:
    * one MC block (small m, e.g. a conv's output channels): C panel m x NC is small and stays
      in L1/L2, so extra passes are cheap; KC keeps the B sliver in 3/4 of L1 and NC keeps the
      B panel in half of L2 (it is consumed right after packing). Measured ~15% on conv 3x3.
    * otherwise C passes go to DRAM: KC = K up to 1280 (one pass; the epilogue sees the final
      sum straight from the micro-kernel), else the B sliver in half of L2; MC x KC in half of
      L2; the shared KC x NC panel in half of L3. Measured: KC=1024 beats 256 on 2048x1024x4096.
    """
    mr, nr = micro or pick_micro_tile(m, n, unit)
    kc_l1 = max(16, (3 * l1_bytes // 4) // (4 * nr) // 16 * 16)
    if _round_up(m, mr) * min(k, kc_l1) * 4 <= l2_bytes // 2:
        kc = _split(k, kc_l1)
        mc, shared = _round_up(m, mr), l2_bytes
    else:
        kc = k if k <= 1280 else _split(k, max(16, min(1024, (l2_bytes // 2) // (4 * nr))))
        mc = max(mr, min(_round_up(m, mr), (l2_bytes // 2) // (4 * kc) // mr * mr))
        shared = l2_bytes if m <= mc else l3_bytes
    nc = max(nr, min(_round_up(n, nr), (shared // 2) // (4 * kc) // nr * nr))
    return Blocking(mr, nr, mc, kc, nc, unit.lanes)
