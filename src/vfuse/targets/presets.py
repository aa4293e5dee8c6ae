"""GPU targets from vendor spec sheets, so that a CPU-only machine can plan for them.

Sources (NVIDIA data sheets and architecture whitepapers; dense, i.e. without 2:4 sparsity):
- A100 SXM4 80GB: 108 SMs, HBM2e 2.039 TB/s, 40 MB L2, up to 164 KB shared memory per SM
  (192 KB L1/smem), 65536 32-bit registers per SM, 255 per thread, 2048 threads per SM;
  fp32 19.5 TFLOPS, fp16/bf16 tensor 312 TFLOPS, int8 624 TOPS, no fp8 tensor cores.
  (NVIDIA A100 Tensor Core GPU data sheet; "NVIDIA A100 Tensor Core GPU Architecture" whitepaper.)
- H100 SXM5 80GB: 132 SMs, HBM3 3.35 TB/s, 50 MB L2, 228 KB shared memory per SM (256 KB L1/smem),
  65536 registers per SM, 2048 threads per SM; fp32 67 TFLOPS, fp16/bf16 tensor 989 TFLOPS,
  int8 1979 TOPS, fp8 tensor 1979 TFLOPS. (NVIDIA H100 data sheet; "NVIDIA H100 Tensor Core GPU
  Architecture" whitepaper.)
- H200 SXM 141GB: the same GH100 compute die as H100 SXM (132 SMs, same peaks) with HBM3e
  at 4.8 TB/s. (NVIDIA H200 data sheet.)

Two figures are not on any spec sheet and are estimates, stated as such:
- launch_s = 3 us: typical kernel launch-to-launch gap of back-to-back launches without CUDA Graphs.
- cache_bw = 2.5x HBM bandwidth: the order of L2 bandwidth reported by microbenchmark studies.
"""

from __future__ import annotations

from vfuse.targets.target import Target

KB = 1024
MB = 1024 * 1024
TERA = 1e12
LAUNCH_S = 3e-6
L2_OVER_HBM = 2.5


def _gpu(
    name: str, sms: int, hbm: float, l2: int, smem: int, l1: int, f32: float, f16: float, i8: float, f8: float = 0.0
) -> Target:
    return Target(
        name=name,
        kind="gpu",
        cores=sms,
        simd_lanes=32,
        l1_bytes=l1,
        l2_bytes=l2,
        l3_bytes=0,
        smem_per_sm=smem,
        regs_per_thread=255,
        regs_per_sm=65536,
        dram_bw=hbm,
        cache_bw=hbm * L2_OVER_HBM,
        peak_f32=f32,
        peak_f16=f16,
        peak_bf16=f16,
        peak_i8=i8,
        vector_f32=f32,
        launch_s=LAUNCH_S,
        max_threads=sms * 2048,
        source="spec sheet",
        peak_f8=f8,
    )


PRESETS: dict[str, Target] = {
    "a100": _gpu("a100", 108, 2.039 * TERA, 40 * MB, 164 * KB, 192 * KB, 19.5 * TERA, 312 * TERA, 624 * TERA),
    "h100": _gpu(
        "h100", 132, 3.35 * TERA, 50 * MB, 228 * KB, 256 * KB, 67 * TERA, 989 * TERA, 1979 * TERA, 1979 * TERA
    ),
    "h200": _gpu("h200", 132, 4.8 * TERA, 50 * MB, 228 * KB, 256 * KB, 67 * TERA, 989 * TERA, 1979 * TERA, 1979 * TERA),
}
