"""The hardware description the cost model reads: one frozen record per target.

A Target is plain data. `cpu` is detected and measured on the machine (`vfuse.targets.cpu`);
`a100`, `h100`, `h200` are presets from spec sheets (`vfuse.targets.presets`), so planning for
a GPU needs no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.ir import DType
from vfuse.targets.isa import Isa, IsaExtra, describe_isa


@dataclass(frozen=True, slots=True)
class Target:
    """What the fusion cost model needs to know about one machine, in SI units.

    cores: CPU cores usable by this process, or GPU streaming multiprocessors (SMs).
    simd_lanes: fp32 lanes of one vector instruction (CPU: 16 with AVX-512, 8 with AVX2, 4 for
        SSE or NEON; the schedule sizes lanes, strips and column tiles by it) or threads of a warp (GPU).
    l1_bytes: L1 data cache per core (CPU) or combined L1/shared memory per SM (GPU).
    l2_bytes: L2 per core (CPU) or the whole chip's L2 (GPU).
    l3_bytes: last-level cache of the CPU (0 on GPUs, whose last level is L2).
    smem_per_sm: shared memory one SM can give to kernels (0 on CPUs).
    regs_per_thread / regs_per_sm: architectural registers (CPU: vector registers of one core).
    dram_bw / cache_bw: bytes/s from DRAM (HBM) and from the last-level cache.
    peak_*: dense matrix-unit flop/s per operand dtype (what a contraction can reach).
    vector_f32: flop/s of plain (non-matrix) fp32 arithmetic, used for pointwise and reductions.
    launch_s: fixed cost of one kernel: GPU launch latency or CPU parallel-region fork/join.
    max_threads: hardware threads resident at once (CPU cores; GPU SMs * threads per SM).
    isa / isa_extras: the instruction-set tier CPU kernels are compiled for and its optional
        extensions (`targets.isa`; None on GPU presets).
    l1_bw / l2_bw: bytes/s of a kernel whose data stays in L1 / L2 (0: unknown, the cost model
        then uses dram_bw for every size); serial_launch_s: fixed cost of a kernel too small to
        fork threads (0: unknown, launch_s); dram_bw_thread: one thread's DRAM bandwidth (0:
        unknown); transcendental_f32: IR flop/s of exp, tanh, GELU and the like (0: vector_f32);
        op_rates: (op name, IR flop/s) of the transcendental ops calibrated one by one;
        chain_weight: how much longer a kernel's pointwise work takes per transcendental op past
        the first (their constants compete for registers), 0 when unknown; attention_task_s: the
        fixed cost of one (batch, head) task of the attention template, 0 when unknown;
        attention_f32: the attention template's fp32 flop/s past those tasks (0: peak_f32);
        strided_run_s: one row run of a column walk past the LLC, on one thread (0: the cost
        model's default, `fusion/cost_columns.STRIDED_RUN_S`).
        Set by calibrating vfuse's own kernels (`targets/calibrate.py`).
        peak_f8: fp8 matrix flop/s (0: no fp8 matrix unit; fp8 operands are widened first and
        run at the fp16 rate on GPUs, the fp32 rate on CPUs, where torch computes them).
        library_f32: torch's library GEMM (MKL / oneDNN / OpenBLAS) in fp32 flop/s, fitted by the
        calibration as the template's peak_f32 is, so their ratio is the tier's template-or-library
        figure (`fusion/library.py`); 0 when not calibrated.
        contraction_elem_s / contraction_call_s: the GEMM and conv templates' time past their flops
        at peak_f32, per element of A, B and C packed or stored (one thread: divided by the cores) and
        per call; what makes small and thin contractions run at a fraction of the peak (0: unknown).
        library_f32, library_elem_s, library_call_s: the same three figures of torch's library GEMM.
        library_attention_f32: torch's fused SDPA in fp32 flop/s, fitted as attention_f32 is (0: not
        calibrated); its ratio to attention_f32 decides attention's template or library.
        library_gain: torch's vector width over this target's: its libraries run at the CPU's own
        width whatever tier vfuse compiles for (2 for AVX2 code on an AVX-512 CPU; set by
        `targets/cpu.at_tier`), the uncalibrated template-or-library verdicts' width factor.
    """

    name: str
    kind: str
    cores: int
    simd_lanes: int
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    smem_per_sm: int
    regs_per_thread: int
    regs_per_sm: int
    dram_bw: float
    cache_bw: float
    peak_f32: float
    peak_f16: float
    peak_bf16: float
    peak_i8: float
    vector_f32: float
    launch_s: float
    max_threads: int
    source: str = ""
    isa: Isa | None = None
    isa_extras: frozenset[IsaExtra] = frozenset()
    l2_bw: float = 0.0
    serial_launch_s: float = 0.0
    dram_bw_thread: float = 0.0
    l1_bw: float = 0.0
    transcendental_f32: float = 0.0
    op_rates: tuple[tuple[str, float], ...] = ()
    chain_weight: float = 0.0
    attention_task_s: float = 0.0
    attention_f32: float = 0.0
    strided_run_s: float = 0.0
    peak_f8: float = 0.0
    library_f32: float = 0.0
    contraction_elem_s: float = 0.0
    contraction_call_s: float = 0.0
    library_elem_s: float = 0.0
    library_call_s: float = 0.0
    library_attention_f32: float = 0.0
    library_gain: float = 1.0

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def isa_description(self) -> str:
        """`avx512 (vbmi, vnni, bf16)`: the tier and its extensions ("" without a tier)."""
        return describe_isa(self.isa, self.isa_extras) if self.isa else ""

    @property
    def llc_bytes(self) -> int:
        """Last-level cache: data that fits here is read back at cache_bw instead of dram_bw."""
        return self.l2_bytes if self.is_gpu else self.l3_bytes

    def matrix_peak(self, dtype: DType) -> float:
        """Peak flop/s of a contraction whose operands have `dtype`."""
        if dtype is DType.BF16:
            return self.peak_bf16
        if dtype is DType.F16:
            return self.peak_f16
        if dtype in (DType.I8, DType.U8):
            return self.peak_i8
        if dtype.is_fp8:
            return self.peak_f8 or (self.peak_f16 if self.is_gpu else self.peak_f32)
        if dtype is DType.F64:
            # No fp64 figure is kept: every target here runs fp64 at <= half the fp32 rate.
            return self.peak_f32 / 2
        return self.peak_f32


# A DRAM copy per core: no core streams more than ~120 GB/s (Apple M-class; x86 cores 10-40), none
# fewer than 1.5 GB/s (a Raspberry Pi 4 core ~2.5). Beyond them the clock or a neighbour lied: a VM
# here measured 879 GB/s and, under load, 2.3 GB/s on 2 cores; the save-or-recompute cut and the
# planner then chose by a figure 40x off (training peaks above Inductor's at the high one).
DRAM_BW_PER_CORE = (1.5e9, 120e9)
