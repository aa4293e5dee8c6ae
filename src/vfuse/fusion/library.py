"""Template or library: whether a contraction runs as vfuse's generated template or through
torch's library (oneDNN / MKL / OpenBLAS) with the rest of its group fused around it.

Both are priced from the planner's cost of the group (`fusion.cost`, the same model that made
the group), so the comparison uses the target's peak and bandwidth:

* template: the group's time, plus the flops its register tile computes past the edges of C
  (a 64-wide tile on an N = 3 output computes 64 columns) at the same peak; on a calibrated target
  the group's time includes the template's own per-call and per-element overheads
  (`Cost.template_s`, `cost.template_extra_s`), which only this side pays;
* library: the group's time without those overheads but with the library's own (calibrated the
  same way: `Cost.library_extra_s`), for the useful flops (library GEMMs cover
  ragged edges with narrower kernels) at the library's rate (`library_efficiency`: as calibrated for
  the tier on this machine, else `LIBRARY_EFFICIENCY` of the template's rate times torch's width over
  the tier's), plus one torch call (dispatch, an output allocation, leaving the native segment), the
  group's producers of the contraction run op by op (`producers_s`), a fresh output's page faults
  past 32 MiB, and, when the group has an epilogue, a second pass over the output: the epilogue then
  runs as its own kernel, reading the contraction's output back instead of working on it in registers.

At the CPU's own tier the library wins only when the tile's waste costs more than the call, the lost
fusion and its lower rate: outputs far narrower than a tile (Linear(d, 1) heads), and stride-1 convs on
small planes, whose padded-width columns overshoot the last tile (8x8 planes: 72 columns for 64); at a
forced lower tier torch keeps the CPU's width and wins most large GEMMs and attention. Attention's
library is torch's fused SDPA (`Efficiency.attention`). The schedule asks (`schedule/build.py`) and
runs such a contraction through torch, reason `Rule.LIBRARY_CONTRACTION`, shown in the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from vfuse.fusion.cost import kernel_cost, retimed, vector_weight
from vfuse.fusion.forms import Form, numel_of, per_element_flops
from vfuse.fusion.libm import scalar_flops
from vfuse.fusion.plan import Cost
from vfuse.fusion.rules import Rule
from vfuse.ir import Graph, Node, Op
from vfuse.ir.sym import hint
from vfuse.targets import Target

# The library's GEMM/conv rate relative to the template's on whole tiles, where the tier has no
# calibration. Measured (docs/perf-log.md, Zen 4, AVX-512, one thread, under load): GEMMs of
# 256 x 256..1024 within +-5 % of each other; 3x3 convs on 8x8..32x32 planes lost to oneDNN where the
# template's padding waste was 1.25-2x and came within 1-5 % at 1.06x; 0.9 keeps a contraction in the
# template up to ~11 % predicted waste. A calibrated tier measures its own (`library_efficiency`).
LIBRARY_EFFICIENCY = 0.9
# A calibrated ratio is clamped to this range: one timed shape on a loaded machine must not send every
# contraction to torch (or keep a 2x padded one in the template).
EFFICIENCY_RANGE = (0.5, 1.5)
# One torch call from a compiled graph: leaving the native segment, ATen dispatch, allocating
# the output (the runtime's torch step, measured at 5-15 us on Zen 4 under load; docs/perf-log.md).
LIBRARY_CALL_S = 10e-6
# A pointwise op in torch cuts its kernel in two: the torch call, one more native call and the general
# call path instead of the lean one. Measured (session 26, Xeon, 2 threads): sin(2x) + 1 on 4096 floats
# 17 us as one kernel (scalar sin), 25 us split around torch.sin; so two calls' worth.
SPLIT_CALLS = 2


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The library's fp32 GEMM rate over the template's (`attention`: torch's SDPA over the attention
    template's), and where the figures come from (`gain`: torch's vector width over the tier's, which
    scales the uncalibrated defaults)."""

    ratio: float = LIBRARY_EFFICIENCY
    calibrated: bool = False
    attention: float = LIBRARY_EFFICIENCY
    gain: float = 1.0
    attention_calibrated: bool = False

    def describe(self) -> str:
        where = "calibrated" if self.calibrated else "default"
        if not self.calibrated and self.gain != 1.0:
            where += f", torch at {self.gain:g}x this tier's vector width"
        return f"library at {self.ratio:.2f}x the template's rate, {where}"

    def for_attention(self) -> Efficiency:
        """The same figures with torch's SDPA rate as the ratio (the attention verdict's)."""
        return replace(self, ratio=self.attention, calibrated=self.attention_calibrated)


def _clamped(ratio: float) -> float:
    lo, hi = EFFICIENCY_RANGE
    return min(max(ratio, lo), hi)


def library_efficiency(target: object) -> Efficiency:
    """The target's calibrated library-over-template rates (each fitted net of its own overheads on
    one thread, `entry/calibrate.py`: GEMM and attention), clamped to EFFICIENCY_RANGE; without a
    calibration LIBRARY_EFFICIENCY times `Target.library_gain` (at a forced lower tier torch's
    libraries keep the CPU's own width: AVX2 templates against AVX-512 MKL on a Xeon)."""
    gain = float(getattr(target, "library_gain", 1.0))
    default = _clamped(LIBRARY_EFFICIENCY * gain)
    peak = float(getattr(target, "peak_f32", 0.0))
    lib = float(getattr(target, "library_f32", 0.0))
    own = float(getattr(target, "attention_f32", 0.0)) or peak
    sdpa = float(getattr(target, "library_attention_f32", 0.0))
    timed = sdpa > 0 and own > 0
    attention = _clamped(sdpa / own) if timed else default
    if lib <= 0 or peak <= 0:
        return Efficiency(default, False, attention, gain, timed)
    return Efficiency(_clamped(lib / peak), True, attention, gain, timed)


@dataclass(frozen=True, slots=True)
class ContractionChoice:
    """The two predicted times of one contraction group, in seconds, and the verdict."""

    template_s: float
    library_s: float
    efficiency: Efficiency | None = None  # the CPU verdict's library rate (GPU verdicts: per family)

    @property
    def library(self) -> bool:
        return self.library_s < self.template_s

    def reason(self) -> str:
        rate = f" ({self.efficiency.describe()})" if self.efficiency is not None else ""
        return (
            f"{Rule.LIBRARY_CONTRACTION.value}: torch predicted {self.library_s * 1e6:.1f} us, "
            f"the template {self.template_s * 1e6:.1f} us{rate}"
        )


@dataclass(frozen=True, slots=True)
class PointwiseChoice:
    """A scalar-libm op's two predicted times (`fusion/libm.py`), in seconds, and the verdict."""

    kernel_s: float
    torch_s: float
    cost: Cost  # the node alone as a kernel (its calls included)

    @property
    def torch(self) -> bool:
        return self.torch_s < self.kernel_s

    def reason(self) -> str:
        return (
            f"{Rule.LIBRARY_POINTWISE.value}: torch predicted {self.torch_s * 1e6:.1f} us, "
            f"scalar libm calls in a kernel {self.kernel_s * 1e6:.1f} us"
        )


def pointwise_choice(node: Node, graph: Graph, target: Target) -> PointwiseChoice | None:
    """Kernel or torch for a node whose C++ loop calls scalar libm (None for any other node). The
    kernel side: the node alone as a kernel, one call per element. The torch side: the same kernel
    computed in vectors (torch's SLEEF, priced like vfuse's own vector math at the CPU's own width),
    plus SPLIT_CALLS calls, plus its input and output through memory once more (in torch it fuses with
    nothing)."""
    if not scalar_flops(node, target):
        return None
    domain = numel_of(node)
    form = Form("pointwise", node.kind, domain, 0, {node.name: domain})
    cost = kernel_cost([node], tuple(dict.fromkeys(node.inputs)), [node.name], form, graph, target)
    flops = per_element_flops(node, graph) * hint(domain) * vector_weight(node, graph, target)
    vector_s = flops / (target.vector_f32 * target.library_gain)  # torch's SLEEF at the CPU's own width
    torch_s = retimed(cost, vector_s, target.kind) + SPLIT_CALLS * LIBRARY_CALL_S + cost.memory_s
    return PointwiseChoice(cost.time_s, torch_s, cost)


def bandwidth_of(cost: Cost) -> float:
    """The bytes/s the cost model priced a group's memory traffic at (inf without any)."""
    return cost.bytes / cost.memory_s if cost.memory_s > 0 else math.inf


def tile_waste(m: int, n: int, mr: int, nr: int) -> float:
    """Flops the mr x nr register tile computes over an m x n output, per useful flop (>= 1)."""
    m, n = hint(m), hint(n)  # cost figures at a symbolic size's hint
    if m <= 0 or n <= 0:
        return 1.0
    return (math.ceil(m / mr) * mr * math.ceil(n / nr) * nr) / (m * n)


# Ops torch runs as views of their operand: one interpreter dispatch, no pass over the data (a reshape
# that has to copy is priced as a view: a lower bound of the torch side).
VIEW_OPS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.GET_ITEM})
# One view op run through the interpreter in a torch step (python, ATen dispatch, no allocation):
# measured in GPT-2's attention step (session 27, Xeon) 3.6 us a reshape or permute, 5 a slice, 7 an expand.
VIEW_CALL_S = 4e-6


def producers_s(nodes: Iterable[str], graph: Graph, bandwidth: float) -> float:
    """What the torch side pays for a contraction's in-group producers, which it runs op by op before the
    contraction (`schedule/build._contraction_split`) where the template computes them while loading:
    a view its dispatch, any other op one torch call and its output written and read back. LLaMA's
    attention carries RoPE, the GQA head expansion and the causal mask (34 nodes: 1.2 ms in torch against
    the template's 0.23 ms at forced AVX2, measured in session 27)."""
    total = 0.0
    for n in nodes:
        node = graph[n]
        if node.op in VIEW_OPS:
            total += VIEW_CALL_S
        elif node.op not in (Op.INPUT, Op.CONSTANT):
            total += LIBRARY_CALL_S + 2 * hint(node.type.nbytes) / bandwidth
    return total


# torch allocates a contraction's output on every call; past glibc's largest mmap threshold (32 MiB) that
# is fresh pages, faulted in and zeroed as they are written. Measured (session 27, Xeon VM, 2 threads):
# `vfuse bench`'s copy of linear_gelu_smallk's 268 MB 10.0 ms into a reused buffer, 29.9 ms into a new one.
FRESH_FROM_BYTES = 32 << 20
FRESH_BYTE_S = 20e-3 / 268e6


def fresh_output_s(out_bytes: int) -> float:
    """What writing a new `out_bytes` torch output costs past writing reused memory."""
    return out_bytes * FRESH_BYTE_S if out_bytes >= FRESH_FROM_BYTES else 0.0


def choose(
    cost: Cost,
    waste: float,
    out_bytes: int,
    epilogue: bool,
    efficiency: Efficiency = Efficiency(),
    producers: float = 0.0,
) -> ContractionChoice:
    """Template or library for a contraction group of planner cost `cost` whose template's tile
    computes `waste` times the useful flops; `out_bytes`: the contraction's output, which a split
    epilogue reads back and writes again (`epilogue`: the group has pointwise work after it);
    `efficiency`: the library's rate over the template's (`library_efficiency`); `producers`: seconds
    torch spends on the group's producers of the contraction (`producers_s`). The template's own
    overheads (`cost.template_s`) are neither padded nor charged to the library, which pays its own
    (`cost.library_extra_s`)."""
    work_s = cost.compute_s - cost.template_s  # what both sides compute
    template_s = cost.time_s + work_s * (waste - 1.0)
    # The library's compute at its rate, overlapped with the same memory traffic: a GEMM bound by writing
    # its output (K = 64: 16384 x 64 -> 4096) is not faster in wider vectors (torch 80 ms, predicted 53).
    library_s = retimed(cost, work_s / efficiency.ratio) + cost.library_extra_s
    library_s += LIBRARY_CALL_S + producers + fresh_output_s(out_bytes)
    if epilogue:
        library_s += cost.launch_s + 2 * out_bytes / bandwidth_of(cost)
    return ContractionChoice(template_s, library_s, efficiency)


# GPU targets: the Triton template's time over torch's library on the same contraction (cuBLAS,
# cuDNN, flash SDPA), with the autotuner's tiles. Measured on an H200 (torch 2.11 / Triton 3.6,
# bf16, docs/benchmarks.md): an 8192x4096x4096 GEMM + GELU 475 us vs cuBLAS ~395 us + a 32 us
# GELU pass; a 3x3 conv 32x128x56x56 NHWC 355 us vs cuDNN ~80 us; attention B8 H16 N1024 D64
# 145 us vs flash 87 us (causal 111 vs 61). The library's share of a template's compute time:
GPU_LIBRARY_SHARE = {"gemm": 0.84, "conv": 0.23, "attention": 0.6}


def choose_gpu(cost: Cost, family: str, out_bytes: int, epilogue: bool) -> ContractionChoice:
    """Template or library on a GPU target: the library does the group's compute in
    `GPU_LIBRARY_SHARE[family]` of the template's time (never below the group's memory time),
    plus one launch, and a split epilogue reads and writes the output once more. Small
    contractions stay templates (one launch, the epilogue in registers); large ones go to the
    library where our template is measured slower."""
    share = GPU_LIBRARY_SHARE.get(family, 1.0)
    core = max(cost.compute_s, cost.memory_s)
    library_s = cost.time_s - core + max(cost.compute_s * share, cost.memory_s) + cost.launch_s
    if epilogue:
        bandwidth = cost.bytes / cost.memory_s if cost.memory_s > 0 else math.inf
        library_s += cost.launch_s + 2 * out_bytes / bandwidth
    return ContractionChoice(cost.time_s, library_s)
