"""`vfuse calibrate`: time vfuse's own kernels on this machine and cache the rates per tier.

Each figure comes from a small graph compiled with vfuse and profiled on one thread (the fastest
of `reps` runs: on a shared machine the fastest run is the one least disturbed):

  l1_bw ... dram_bw        the streaming add `x + y` with its 12 bytes per element in L1 and L2
                           (half of one core's), in L3 (a quarter) and in DRAM (four times L3)
  vector_f32               IR flops per second of a chain of cheap ops (mul, add, abs, max, relu) in L2,
                           less the memory time the cost model does not overlap
  transcendental_f32       the same for a chain of exp, tanh, sigmoid, GELU, SiLU
  op_rates                 exp, tanh, sigmoid, GELU, SiLU, log each alone
  chain_weight             the chain's time over the sum of its ops' times alone, per op past the first
  attention_task_s         attention's fixed cost per (batch, head) task and its flop/s, fitted to its
  attention_f32            times on 8 heads of 16 x 64 (mostly the tasks) and 2 heads of 256 x 64
  library_attention_f32    torch's SDPA flop/s, fitted the same way to its times on the same inputs
  peak_f32                 the GEMM template's flop/s, fitted with contraction_elem_s (per element of
  contraction_elem_s       A, B and C) and contraction_call_s (per call) to its times over
  contraction_call_s       LIBRARY_SHAPES and OVERHEAD_SHAPES (16 x 16 x 16 to 336 x 384 x 384)
  library_f32              torch.mm's flop/s, fitted with library_elem_s and library_call_s to its
  library_elem_s           times over the same shapes as the template's (its ratio to peak_f32 and
  library_call_s           both sides' overheads decide whether a contraction runs in the template or
                           in torch: fusion/library.py)
  strided_run_s            a column sum past L3 (768 columns): its time per row run of a column tile
  serial_launch_s          `x + 1` on 256 elements (no threads forked)
  launch_s                 a 64K-element add on all cores, minus its data time at L2 bandwidth

`targets/calibrate.py` holds the result, the plausibility guard and the cache; `targets/cpu.py`
applies a tier's calibration whenever that tier's target is read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vfuse.fusion.cost_columns import COLUMN_VECTORS
from vfuse.ir import DType, Op, TensorType, opdef
from vfuse.targets import DEFAULT_CACHE_DIR, Target
from vfuse.targets.calibrate import Calibration, guarded, write
from vfuse.targets.cpu import detect, machine_isa, measured_target, templates_planned
from vfuse.targets.isa import LANES


def _kernel(
    fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], reps: int, threads: int = 1, **options: Any
) -> Any:
    """The profile row of the graph's only kernel (the fastest of `reps` runs in `best_s`)."""
    import vfuse

    g = vfuse.compile(fn, inputs, **options)
    rows = [r for r in g.profile(*inputs, reps=reps, threads=threads) if r.runs != "torch"]
    return rows[-1]


def _transcendental(x: torch.Tensor) -> torch.Tensor:
    return F.silu(F.gelu(torch.sigmoid(torch.tanh(torch.exp(x)))))


def _cheap(x: torch.Tensor) -> torch.Tensor:
    y = torch.abs(x * 0.5 + 1.0) * x - 0.25
    return torch.relu(torch.maximum(y * y + x, -x) * 0.75 - y)


ALONE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp": torch.exp,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "silu": F.silu,
    "log": torch.log,
}


def op_rates(
    n: int, l2_bw: float, reps: int, ops: Sequence[str] = tuple(ALONE), **options: Any
) -> tuple[tuple[str, float], ...]:
    """IR flop/s of each op of ALONE named in `ops` on its own, a graph each (in one graph,
    horizontal fusion would run them as one kernel)."""
    rates = []
    for op in ops:
        row = _kernel(ALONE[op], (torch.rand(n) + 0.5,), reps, **options)
        rates.append((op, _compute_rate(row, l2_bw)))
    return tuple(rates)


def ir_flops(op: str) -> int:
    """The IR's flops per element of a unary fp32 op (its OpDef), to weigh the chain's ops."""
    t = TensorType((1,), DType.F32)
    return int(opdef(Op(op)).flops((t,), t, {}))


def chain_weight(chain: list[tuple[str, int]], chain_rate: float, rates: dict[str, float]) -> float:
    """Extra time per transcendental op past the first: the chain's time over the sum of its ops'
    times alone, less one, spread over the ops past the first (0 without every op's own rate)."""
    if len(chain) < 2 or any(op not in rates for op, _ in chain):
        return 0.0
    alone_s = sum(flops / rates[op] for op, flops in chain)
    chained_s = sum(flops for _, flops in chain) / chain_rate
    return max(chained_s / alone_s - 1.0, 0.0) / (len(chain) - 1)


def _compute_rate(row: Any, l2_bw: float) -> float:
    """IR flop/s of a kernel in L2: its time less the share of its memory time the cost model does
    not hide under compute (gamma = 0.5 on CPUs, fusion/cost.py)."""
    return row.flops / max(row.best_s - 0.5 * row.bytes / l2_bw, 0.25 * row.best_s)


def library_gemm_s(a: torch.Tensor, b: torch.Tensor, reps: int) -> float:
    """The fastest of `reps` torch.mm calls into a preallocated output on one thread (as the
    template is timed: its output is an arena buffer)."""
    out = torch.empty(a.shape[0], b.shape[1])
    return torch_seconds(lambda a, b: torch.mm(a, b, out=out), (a, b), reps)


def template_seconds(m: int, n: int, k: int, reps: int, **options: Any) -> tuple[Any, float]:
    """(the compiled template, its fastest time) for an m x k @ k x n GEMM on one thread."""
    import vfuse

    a, b = torch.randn(m, k), torch.randn(k, n)
    g = vfuse.compile(torch.mm, (a, b), **options)
    rows = [r for r in g.profile(a, b, reps=reps, threads=1) if r.runs != "torch"]
    return g, rows[-1].best_s


def gemm_seconds(m: int, n: int, k: int, reps: int, rounds: int = 3, **options: Any) -> tuple[float, float]:
    """(the template's, torch.mm's) fastest time for an m x k @ k x n GEMM on one thread, timed in
    alternating rounds so that a load on the machine disturbs both alike."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    g, template = template_seconds(m, n, k, reps, **options)
    library = float("inf")
    for _ in range(rounds):
        rows = [r for r in g.profile(a, b, reps=reps, threads=1) if r.runs != "torch"]
        template = min(template, rows[-1].best_s)
        library = min(library, library_gemm_s(a, b, reps))
    return template, library


# (m, n, k) of the GEMMs torch.mm is timed against the template on: the peak's shape (336 rows and 384
# columns are whole register tiles at every tier: 14x32, 6x16, 4x24, ...), a long K (a weight
# gradient's) and a long thin M (a conv's im2col). Zen 3 AVX2 measured parity at all three (0.99-1.06,
# one thread, alternating rounds); the median keeps one disturbed shape from deciding.
LIBRARY_SHAPES = ((336, 384, 384), (256, 256, 1024), (2304, 128, 256))
# Small and thin GEMMs (m, n, k), whose time is mostly packing A and B, storing C and the call: with
# LIBRARY_SHAPES they fit peak_f32 and the per-element and per-call costs (`overheads`). Zen 3 AVX2,
# one thread: 16 x 16 x 16 ran at 8 GF/s, K = N = 16 at 30, against 85 at the peak's shape.
OVERHEAD_SHAPES = ((16, 16, 16), (512, 16, 16), (16, 512, 16), (128, 128, 16), (64, 64, 64))


def overheads(times: dict[tuple[int, int, int], float]) -> tuple[float, float, float]:
    """(flop/s, seconds per element of A, B and C, seconds per call) of the template: the least
    squares fit of t = 2mnk / peak + (mk + kn + mn) * elem + call to the GEMMs `times`, each
    weighted by 1 / t (relative errors); elem and call clamped at 0 (then fitted again without)."""
    shapes = list(times)
    t = np.array([times[s] for s in shapes])
    cols = np.array([[2 * m * n * k, m * k + k * n + m * n, 1.0] for m, n, k in shapes], dtype=float)
    keep = [0, 1, 2]
    while True:
        x, *_ = np.linalg.lstsq(cols[:, keep] / t[:, None], np.ones(len(t)), rcond=None)
        fit = dict(zip(keep, x))
        negative = [i for i in keep[1:] if fit[i] < 0]
        if not negative or fit[0] <= 0:
            break
        keep = [i for i in keep if i not in negative]
    inv_peak = fit[0] if fit[0] > 0 else sum(c[0] for c in cols) / t.sum()
    return 1.0 / inv_peak, max(fit.get(1, 0.0), 0.0), max(fit.get(2, 0.0), 0.0)


def gemm_rates(reps: int, **options: Any) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """`overheads` of the template and of torch.mm (flop/s, seconds per element, per call), each fitted
    to its own times over LIBRARY_SHAPES and OVERHEAD_SHAPES: the verdict charges each side its own
    (`fusion/library.py`); torch packs and stores too, less than the template at some shapes, more at
    others (Zen 3, one thread: 16 x 768 x 768 325 vs 388 us, 1024 x 8 x 1024 513 vs 416 us)."""
    times = {s: gemm_seconds(*s, reps, **options) for s in LIBRARY_SHAPES}
    template = {s: t for s, (t, _) in times.items()}
    library = {s: lib for s, (_, lib) in times.items()}
    for s in OVERHEAD_SHAPES:
        template[s] = template_seconds(*s, 3 * reps, **options)[1]
        m, n, k = s
        library[s] = library_gemm_s(torch.randn(m, k), torch.randn(k, n), 3 * reps)
    return overheads(template), overheads(library)


# (heads, rows, head dim): tiny tasks, their time mostly the fixed cost; larger ones, mostly flops.
ATTENTION_SHAPES = ((8, 16, 64), (2, 256, 64))


def attention_costs(peak: float, reps: int, **options: Any) -> tuple[float, float, float]:
    """(seconds per (batch, head) task, flop/s) of the attention template, solved from its times at
    ATTENTION_SHAPES (t = heads x task + flops / rate); at AVX2 its flops run at ~0.8 of the GEMM's peak,
    at AVX-512 at about the peak. A rate that comes out negative or faster than `peak`: `peak`. Third:
    torch's SDPA flop/s solved the same way from its times on the same inputs (0 where the fit has no
    positive rate; `targets/calibrate.guarded` judges the rest)."""
    runs, library = [], []
    for heads, rows, dim in ATTENTION_SHAPES:
        qkv = tuple(torch.randn(1, heads, rows, dim) for _ in range(3))
        row = _kernel(F.scaled_dot_product_attention, qkv, reps, **options)
        runs.append((heads, row.flops, row.best_s))
        library.append((heads, row.flops, torch_seconds(F.scaled_dot_product_attention, qkv, reps)))
    task, rate = attention_fit(runs[0], runs[1], peak)
    torch_rate = attention_fit(library[0], library[1], math.inf)[1]
    return task, rate, torch_rate if math.isfinite(torch_rate) else 0.0


def torch_seconds(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], reps: int) -> float:
    """The fastest of `reps` eager calls of `fn` on one thread (as vfuse's kernels are timed)."""
    before, best = torch.get_num_threads(), float("inf")
    try:
        torch.set_num_threads(1)
        fn(*inputs)  # warm up
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(*inputs)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return best


def attention_fit(small: tuple[int, int, float], large: tuple[int, int, float], peak: float) -> tuple[float, float]:
    """(seconds per task, flop/s) solving t = heads x task + flops / rate for two (heads, flops, t) runs."""
    (h1, f1, t1), (h2, f2, t2) = small, large
    per_flop = (t2 * h1 - t1 * h2) / (f2 * h1 - f1 * h2)
    rate = 1 / per_flop if per_flop > 1 / peak else peak
    return max(t1 - f1 / rate, 0.0) / h1, rate


def column_run_s(target: Target, reps: int, **options: Any) -> float:
    """Seconds per row run of a column sum past L3 (`fusion/cost_columns`): 768 columns, a 3 KB row
    stride, one run per row and column tile (24 tiles at AVX2, 12 at AVX-512)."""
    cols = 768
    rows = max(4 * target.l3_bytes, 64 << 20) // (4 * cols)
    walk = _kernel(lambda x: x.sum(0), (torch.ones(rows, cols),), reps, **options)
    return walk.best_s / (rows * -(-cols // (COLUMN_VECTORS * target.simd_lanes)))


def measure_kernels(target: Target, reps: int = 30, ops: Sequence[str] = tuple(ALONE), **options: Any) -> Calibration:
    """The raw per-thread rates of vfuse's kernels at `options`' tier (no guard); `ops`: the
    transcendental ops to time alone."""

    def add_bw(nbytes: int) -> float:
        n = max(nbytes // 12, 64)
        row = _kernel(torch.add, (torch.ones(n), torch.ones(n)), reps, **options)  # values do not matter
        return 12 * n / row.best_s

    l1 = add_bw(target.l1_bytes // 2)
    l2 = add_bw(target.l2_bytes // 2)
    l3 = add_bw(max(target.l3_bytes // 4, 2 * target.l2_bytes))
    dram = add_bw(max(4 * target.l3_bytes, 64 << 20))
    n = max(target.l2_bytes // 16, 1024)
    transcendental = _kernel(_transcendental, (torch.randn(n),), reps, **options)
    chain = [(op, ir_flops(op)) for op in ("exp", "tanh", "sigmoid", "gelu", "silu")]  # _transcendental's ops
    cheap = _kernel(_cheap, (torch.randn(n),), reps, **options)
    alone = op_rates(n // 2, l2, reps, ops, **options)
    (peak, elem, call), (library, library_elem, library_call) = gemm_rates(max(reps // 3, 3), **options)
    tiny = _kernel(lambda x: x + 1, (torch.randn(256),), reps, **options)
    strided_run_s = column_run_s(target, max(reps // 3, 3), **options)
    attention_task_s, attention, library_attention = attention_costs(peak, reps, **options)
    e = 65536
    par = _kernel(torch.add, (torch.ones(e), torch.ones(e)), reps, threads=target.cores, **options)
    launch = par.best_s - 12 * e / (l2 * target.cores)
    return Calibration(
        l1_bw=l1,
        l2_bw=l2,
        l3_bw=l3,
        dram_bw=dram,
        vector_f32=_compute_rate(cheap, l2),
        transcendental_f32=_compute_rate(transcendental, l2),
        peak_f32=peak,
        serial_launch_s=tiny.best_s,
        launch_s=max(launch, 0.0),
        op_rates=alone,
        chain_weight=chain_weight(chain, _compute_rate(transcendental, l2), dict(alone)),
        attention_task_s=attention_task_s,
        attention_f32=attention,
        library_attention_f32=library_attention,
        strided_run_s=strided_run_s,
        library_f32=library,
        contraction_elem_s=elem,
        contraction_call_s=call,
        library_elem_s=library_elem,
        library_call_s=library_call,
    )


def calibrate(
    isa: str = "auto",
    cache_dir: Path | None = None,
    reps: int = 30,
    kernel_cache: Path | None = None,
    ops: Sequence[str] = tuple(ALONE),
) -> tuple[Calibration, list[str], Path]:
    """Measure, guard and cache in `cache_dir` the calibration of tier `isa`: (what was cached, the
    names of the values replaced by the torch-measured ones as implausible, the cache file). The
    kernels timed are built in `kernel_cache` (default: `cache_dir`)."""
    from vfuse.targets.isa import parse_isa

    cache_dir = cache_dir or DEFAULT_CACHE_DIR
    target = measured_target(cache_dir, isa=parse_isa(isa))
    assert target.isa is not None
    write(cache_dir, detect().fingerprint(), target.isa.value, None)  # time kernels planned uncalibrated
    with templates_planned():  # time the templates even where torch at the CPU's width would run instead
        raw = measure_kernels(target, reps, ops, isa=target.isa.value, cache_dir=kernel_cache or cache_dir)
    cal, bad = guarded(raw, target, library_lanes=LANES[machine_isa().tier])
    return cal, bad, write(cache_dir, detect().fingerprint(), target.isa.value, cal)
