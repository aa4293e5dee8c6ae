"""Which form convolution_backward's data gradient takes, priced with the target's figures.

Two forms compute it (`frontend/lower_conv_backward.py`):

* phases: per stride phase, a stride-1 conv of the taps landing on it over grad_output. Each
  phase's weight (channel-swapped, sliced to its taps, flipped) is a layout copy that reads the
  whole weight; the direct conv computes padded-width columns unless they are compact; the
  phases are interleaved by a CAT pass (stride > 1).
* gemm: one MATMUL W^T @ grad_output (the permutes packed, not stored) writing every tap's plane
  (kh*kw times the gradient's elements), then a col2im pass that reads them back and adds.

Each kernel is priced as a roofline on the target: launch_s + max(flops / peak_f32, bytes /
dram_bw). The flops are about equal; the forms differ in bytes and kernels: the col planes against
the per-phase weight copies, their launches and the direct conv's garbage columns. Ties go to the
phases (they keep the conv's fused epilogue). What the figures cannot price is legality:
grouped convs, 1x1 kernels (the forms coincide), more taps than the col2im's kernels take,
symbolic sizes (the GEMM form's phases need fixed offsets).
The choice is recorded on the form's contractions (attr `form`) for the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vfuse.ir.sym import is_sym
from vfuse.targets import Target

F32 = 4
# The direct conv's compact columns (schedule/microtile.compact_conv_columns, which the frontend may
# not import): OW whole vectors of at most 8 lanes, taken wherever they are fewer than the padded
# width (the schedule also rounds both to its register tile's NR, which this price leaves out).
COMPACT_MAX_LANES = 8


@dataclass(frozen=True, slots=True)
class FormChoice:
    """The data gradient's form with the predicted time of each (math.inf: not legal here)."""

    gemm: bool
    gemm_s: float
    phases_s: float
    kernels: tuple[int, int]  # (gemm form, phase form) kernel counts priced
    why: str

    @staticmethod
    def legality(why: str) -> FormChoice:
        """The phase form, the GEMM form not being legal (`why`)."""
        return FormChoice(False, math.inf, math.inf, (0, 0), why)

    def __str__(self) -> str:
        form = "GEMM + col2im" if self.gemm else "conv per stride phase"
        return f"{form} ({self.why})"


@dataclass(frozen=True, slots=True)
class Shapes:
    """The conv's sizes: grad_output (N, Cout, Ho, Wo), weight (Cout, Cin, kh, kw), input (H, W)."""

    go: tuple[int, ...]
    w: tuple[int, ...]
    in_hw: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


def illegal(s: Shapes, max_taps: int) -> str:
    """Why the GEMM form cannot take this conv ("" when it can); `max_taps`: the most tap planes
    its col2im takes (`lower_conv_backward.MAX_GEMM_TAPS`)."""
    taps = s.w[2] * s.w[3]
    if s.groups != 1:
        return f"legality: groups {s.groups} (the GEMM form is groups 1)"
    if taps == 1:
        return "legality: a 1x1 kernel (the forms coincide)"
    if taps > max_taps:
        return f"legality: {taps} taps > {max_taps} (the col2im's kernels)"
    if any(is_sym(d) for d in (*s.go, *s.w, *s.in_hw)):
        return "legality: symbolic sizes"
    return ""


def _kernel_s(target: Target, flops: float, nbytes: float) -> float:
    return target.launch_s + max(flops / target.peak_f32, nbytes / target.dram_bw)


def gemm_s(s: Shapes, target: Target) -> float:
    """One MATMUL (Cin*kh*kw, Cout) @ (Cout, N*Ho*Wo) storing every tap's plane, then the col2im
    pass reading them back and writing the gradient."""
    n, cout, ho, wo = s.go
    cin, taps = s.w[1], s.w[2] * s.w[3]
    col = cin * taps * n * ho * wo
    matmul = _kernel_s(target, 2.0 * col * cout, F32 * (cout * cin * taps + n * cout * ho * wo + col))
    col2im = _kernel_s(target, col, F32 * (col + n * cin * s.in_hw[0] * s.in_hw[1]))
    return matmul + col2im


def _axis_taps(r: int, k: int, s: int, p: int, d: int) -> tuple[int, int]:
    """(taps, span) of phase r along one axis: how many taps land on it and how far apart its
    first and last read grad_output (the padded width past the outputs: `axis_phase`'s (m-1)*e)."""
    taps = [t for t in range(k) if (r + p - t * d) % s == 0]
    if len(taps) < 2:
        return len(taps), 0
    return len(taps), (len(taps) - 1) * (d * (taps[1] - taps[0]) // s)


def _compact(ow: int, wp: int, lanes: int) -> bool:
    """Whether the direct conv computes only the OW outputs of a row rather than its padded width."""
    return lanes <= COMPACT_MAX_LANES and ow % lanes == 0 and ow < wp


def phases_s(s: Shapes, target: Target) -> tuple[float, int]:
    """Per stride phase, the weight copy (the whole weight read, the phase's taps written) and a
    stride-1 conv over grad_output computing padded-width columns; the CAT interleaving them."""
    n, cout, ho, wo = s.go
    cin = s.w[1]
    q = [-(-s.in_hw[i] // s.stride[i]) for i in range(2)]
    total, kernels = 0.0, 0
    for rh in range(s.stride[0]):
        mh, _ = _axis_taps(rh, s.w[2], s.stride[0], s.padding[0], s.dilation[0])
        for rw in range(s.stride[1]):
            mw, span = _axis_taps(rw, s.w[3], s.stride[1], s.padding[1], s.dilation[1])
            if not mh or not mw:
                continue  # zeros, written by the CAT
            wp = q[1] + span
            cols = q[0] * (q[1] if _compact(q[1], wp, target.simd_lanes) else wp)
            weights = cout * cin * mh * mw
            total += _kernel_s(target, 0.0, F32 * (cout * cin * s.w[2] * s.w[3] + weights))
            flops = 2.0 * cin * cout * mh * mw * n * cols
            total += _kernel_s(target, flops, F32 * (n * cout * ho * wo + weights + n * cin * q[0] * q[1]))
            kernels += 2
    if s.stride != (1, 1):
        total += _kernel_s(target, 0.0, F32 * 2 * n * cin * q[0] * q[1] * s.stride[0] * s.stride[1])
        kernels += 1
    return total, kernels


def choose(s: Shapes, target: Target) -> FormChoice:
    """The cheaper form on `target` of a conv both forms take (`illegal` is "")."""
    g = gemm_s(s, target)
    p, kernels = phases_s(s, target)
    gemm = g < p
    sign = "<" if gemm else ">="
    why = f"predicted: GEMM + col2im {g * 1e6:.1f} us, 2 kernels {sign} phase convs {p * 1e6:.1f} us, {kernels} kernels"
    return FormChoice(gemm, g, p, (2, kernels), why)
