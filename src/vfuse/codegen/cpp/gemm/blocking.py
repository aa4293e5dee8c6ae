"""The packed GEMM's cache blocks are the schedule's (schedule/blocks.py): re-exported for the
templates and for templates rendered outside a Program (their default blocks)."""

from __future__ import annotations

from vfuse.schedule.blocks import Blocking as Blocking
from vfuse.schedule.blocks import CallBlocks as CallBlocks
from vfuse.schedule.blocks import choose_blocking as choose_blocking
from vfuse.schedule.microtile import AVX512, micro_tiles

# AVX-512's register tiles (the default unit); the schedule picks per target (schedule/microtile.py).
MICRO_TILES: tuple[tuple[int, int], ...] = micro_tiles(AVX512)
