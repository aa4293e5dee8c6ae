"""A CPU conv template's blocks, the schedule's (`ContractionKernel.gemm_blocks` / `.conv_blocks`):
the GEMM cache blocks of its implicit GEMM (or of the folded weight gradient's one GEMM over all
images), whether it takes the direct path and that path's K and M blocks of channels, the folded
template's threaded passes.
A conv over symbolic planes (docs/dynamic.md) takes the implicit GEMM: its driver blocks at run
time and its gather reads the sizes (`vf_s0`), where the direct path's padded copy and tile are
laid out for constant planes; its cache blocks are the hints' (a performance choice only)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from vfuse.ir import Op
from vfuse.ir.shapes import Shape
from vfuse.ir.sym import hint, is_sym
from vfuse.schedule.blocks import (
    CallBlocks,
    ConvBlocks,
    call_blocks,
    choose_blocking,
    direct_blocks,
    folded_passes,
    gemm_blocks,
    rows_first,
    shared_a,
)
from vfuse.schedule.conv_columns import direct_conv, direct_fits
from vfuse.schedule.conv_fold import folded_mnk
from vfuse.schedule.kernel import ContractionKernel
from vfuse.schedule.microtile import VectorUnit


def conv_gemm_mnk(attrs: Mapping[str, Any], w_shape: Shape, out_shape: Shape) -> tuple[int, int, int]:
    """The per-(image, group) GEMM: M = output channels of a group, N = OH x OW, K = Cg x KH x KW."""
    g = attrs["groups"]
    return w_shape[0] // g, out_shape[2] * out_shape[3], w_shape[1] * w_shape[2] * w_shape[3]


def conv_blocks(
    attrs: Mapping[str, Any],
    shapes: tuple[Shape, ...],
    out_shape: Shape,
    caches: tuple[int, int, int],
    tile: tuple[int, int],
    unit: VectorUnit,
) -> tuple[CallBlocks, ConvBlocks]:
    """(the GEMM cache blocks, the conv's own blocks) of a conv read as `shapes` (x, w), folded
    where `attrs` say so (schedule/conv_fold.py)."""
    x, w = shapes[:2]
    if attrs.get("folded"):
        # Over a symbolic K (the batch, the kernel plane: a weight gradient) the driver picks its
        # blocks per call, as a MATMUL's (`call_blocks`); fixed sizes: `choose_blocking`'s.
        m, n, k = folded_mnk(x, w, out_shape, attrs["groups"])
        blocks = call_blocks(m, n, k, caches, tile, unit)
        return blocks, folded_passes(hint(x[0] * x[1] * x[2] * x[3]), hint(m * n))
    m, n, k = (hint(d) for d in conv_gemm_mnk(attrs, w, out_shape))
    blocks = CallBlocks(m, (choose_blocking(m, n, k, *caches, micro=tile, unit=unit),))
    icb, mb = direct_blocks(hint(w[1]), m, hint(w[2] * w[3]), tile[0], caches)
    compact = bool(attrs.get("compact"))
    planes = (*x[2:], *out_shape[2:])
    direct = (
        direct_conv(attrs, w)
        and not any(map(is_sym, planes))
        and direct_fits(attrs, x, w, out_shape, tile[0], tile[1], compact)
    )
    # Images share the weight: packed once per call for all of them (a strided pass over it per image).
    return blocks, ConvBlocks(icb, mb, direct=direct, weight_once=hint(x[0]) > 1)


def template_blocks(k: ContractionKernel, tile: tuple[int, int], unit: VectorUnit) -> ContractionKernel:
    """`k` (a CPU contraction) with its template's blocks: a MATMUL's cache blocks (per call over a
    symbolic M) and whether it packs A once per call; a conv's (`conv_blocks`)."""
    if k.op is Op.MATMUL:
        blocks = gemm_blocks(k.shapes, k.out_shape, k.caches, tile, unit.lanes)
        a = k.shapes[0]
        rows = rows_first(k.out_shape[-1], a[-1], k.prepacked_b, k.caches[1])
        blocks = dataclasses.replace(blocks, rows_first=rows)
        once = shared_a(a[-2], k.out_shape[-1], a[-1], math.prod(k.out_shape[:-2]), blocks.blocks[0])
        # Threads on their own rows pack A once between them: no pass before the driver for that.
        once = once and not (rows and hint(k.out_shape[-1]) <= blocks.blocks[0].nc)
        return dataclasses.replace(k, gemm_blocks=blocks, shared_a=once)
    if k.op is Op.CONV2D:
        blocks, conv = conv_blocks(k.attrs, k.shapes, k.out_shape, k.caches, tile, unit)
        return dataclasses.replace(k, gemm_blocks=blocks, conv_blocks=conv)
    return k
