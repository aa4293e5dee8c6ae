"""`vfuse bench --device cuda`: the GPU benchmark, one JSON file, at most about 5 minutes on one GPU.

Measured: copy bandwidth (`dst.copy_(src)`, the yardstick); every workload (the memory-bound set in
bf16 and fp32, linear_gelu, conv_bn_relu, attention and causal attention, a GPT-2 block) for
eager, Inductor, vfuse (backend="triton") without and with CUDA Graphs, each checked against
eager; a memory-bound workload's share of copy bandwidth; and the per-call overhead of a tiny
graph: launches (vfuse without graphs, eager) against one graph replay.

`--smoke` runs the same code on the CPU with tiny sizes: tensors on the CPU, vfuse's kernels in
Triton's interpreter, graph capture through `runtime.cudagraphs.ReplayDriver` (it reruns the
captured work), CUDA events replaced by a host clock behind the same `Timer` interface. The
JSON schema is the same (tests/bench/test_bench_device.py checks it). A time budget (`--budget-s`,
default 280 s) skips what is left, recorded per contender, so the run ends in time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

SCHEMA = "vfuse-bench-device/1"
CONTENDERS = ("eager", "inductor", "vfuse", "vfuse_graphs")
PRESETS = {"H200": "h200", "H100": "h100", "A100": "a100"}


class Timer(Protocol):
    """Seconds per call of `fn`: CUDA events on a GPU, a host clock on the CPU."""

    def per_call(self, fn: Callable[[], Any], calls: int) -> float: ...


class CudaTimer:
    def per_call(self, fn: Callable[[], Any], calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls


class HostTimer:
    def per_call(self, fn: Callable[[], Any], calls: int) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t) / calls


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: the GPU's (large enough to stream from HBM) or the smoke run's."""

    rows: int
    cols: int
    batch: int
    seq: int
    heads: int
    dim: int
    image: int
    channels: int
    copy_bytes: int
    reps: int
    calls: int


GPU = Sizes(8192, 4096, 8, 1024, 16, 64, 56, 128, 1 << 30, 15, 20)
SMOKE = Sizes(6, 40, 1, 8, 2, 8, 6, 4, 1 << 20, 2, 1)


@dataclass(frozen=True)
class Workload:
    name: str
    family: str  # memory (reported against copy bandwidth), gemm, conv, attention, block
    dtype: str
    make: Callable[[Sizes, torch.device, torch.dtype], tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]


def _rand(*shape: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


def _param(t: torch.Tensor) -> torch.Tensor:
    """Weights as parameters: a CUDA graph reads them in place instead of copying them per call."""
    return torch.nn.Parameter(t, requires_grad=False)


def _memory(fn: Callable[..., Any], row_param: bool) -> Callable[..., Any]:
    def make(s: Sizes, dev: torch.device, dt: torch.dtype) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
        x = _rand(s.rows, s.cols, device=dev, dtype=dt)
        y = _rand(s.cols, device=dev, dtype=dt) if row_param else _rand(s.rows, s.cols, device=dev, dtype=dt)
        return fn, (x, y)

    return make


MEMORY = {
    "add_mul_relu": (lambda x, y: ((x + y) * y).relu(), False),
    "layernorm_gelu": (lambda x, w: F.gelu(F.layer_norm(x, (x.shape[-1],), w)), True),
    "rmsnorm_silu": (lambda x, w: F.silu(F.rms_norm(x, (x.shape[-1],), w)), True),
    "softmax_scale": (lambda x, y: torch.softmax(x * 0.125 + y, -1), True),
    "sum_rows": (lambda x, y: (x * y).sum(-1), True),
}


def _linear_gelu(s: Sizes, dev: torch.device, dt: torch.dtype) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    x = _rand(s.rows, s.cols, device=dev, dtype=dt)
    w, b = _param(_rand(s.cols, s.cols, device=dev, dtype=dt)), _param(_rand(s.cols, device=dev, dtype=dt))
    return (lambda x, w, b: F.gelu(F.linear(x, w, b))), (x, w, b)


def _conv_bn_relu(s: Sizes, dev: torch.device, dt: torch.dtype) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    c = s.channels
    x = _rand(s.batch * 4, c, s.image, s.image, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    w, mean = _param(_rand(c, c, 3, 3, device=dev, dtype=dt)), _param(_rand(c, device=dev, dtype=dt))
    var = _param(torch.rand(c, device=dev).to(dt) + 0.5)

    def fn(x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(F.conv2d(x, w, padding=1), mean, var, training=False).relu()

    return fn, (x, w, mean, var)


def _attention(causal: bool) -> Callable[..., Any]:
    def make(s: Sizes, dev: torch.device, dt: torch.dtype) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
        q, k, v = (_rand(s.batch, s.heads, s.seq, s.dim, device=dev, dtype=dt) for _ in range(3))
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), (q, k, v)

    return make


def _gpt2_block(s: Sizes, dev: torch.device, dt: torch.dtype) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    d = s.heads * s.dim
    g = torch.Generator().manual_seed(0)
    p = {n: _param((torch.randn(*shape, generator=g) * 0.02).to(dev, dt)) for n, shape in _gpt2_shapes(d).items()}
    x = _rand(s.batch, s.seq, d, device=dev, dtype=dt)

    def block(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        ln1, wqkv, wo, ln2, w1, w2 = w
        h = F.layer_norm(x, (d,), ln1)
        q, k, v = F.linear(h, wqkv).split(d, -1)
        q, k, v = (t.unflatten(-1, (s.heads, s.dim)).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + F.linear(a, wo)
        return x + F.linear(F.gelu(F.linear(F.layer_norm(x, (d,), ln2), w1), approximate="tanh"), w2)

    return block, (x, *p.values())


def _gpt2_shapes(d: int) -> dict[str, tuple[int, ...]]:
    return {"ln1": (d,), "wqkv": (3 * d, d), "wo": (d, d), "ln2": (d,), "w1": (4 * d, d), "w2": (d, 4 * d)}


WORKLOADS = [
    *(Workload(f"{n}_{dt}", "memory", dt, _memory(*MEMORY[n])) for dt in ("fp32", "bf16") for n in MEMORY),
    Workload("linear_gelu", "gemm", "bf16", _linear_gelu),
    Workload("conv_bn_relu", "conv", "bf16", _conv_bn_relu),
    Workload("attention", "attention", "bf16", _attention(False)),
    Workload("attention_causal", "attention", "bf16", _attention(True)),
    Workload("gpt2_block", "block", "bf16", _gpt2_block),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Result:
    ok: bool = False
    median_us: float | None = None
    min_us: float | None = None
    pct_copy_bw: float | None = None
    max_err: float | None = None
    compile_s: float | None = None
    error: str = ""
    cuda_graphs: str = ""  # vfuse: captured or why not


@dataclass
class Bench:
    device: torch.device
    sizes: Sizes
    timer: Timer
    target: str
    deadline: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()


def _compile(name: str, fn: Callable[..., Any], args: tuple[torch.Tensor, ...], bench: Bench) -> Any:
    """The contender's callable (compiled and run once)."""
    if name == "eager":
        return fn
    if name == "inductor":
        compiled = torch.compile(fn, dynamic=False)
        compiled(*args)
        return compiled
    import vfuse

    graphs = name == "vfuse_graphs"
    compiled = vfuse.compile(fn, args, backend="triton", target=bench.target, cuda_graphs=graphs)
    if graphs and bench.device.type == "cpu":  # smoke: the capture path on the host
        from vfuse.runtime.cudagraphs import ReplayDriver

        compiled.compiled.executor.driver = ReplayDriver
        compiled.compiled.executor.graph_devices = ("cpu",)
    return compiled


def _graph_note(compiled: Any) -> str:
    stats = getattr(getattr(getattr(compiled, "compiled", None), "stats", None), "cuda_graphs", None)
    return stats.describe() if stats is not None else ""


def _check(got: Any, want: Any, dtype: str) -> float:
    """Largest error relative to eager's largest magnitude; raises when out of tolerance."""
    got, want = (
        (got if isinstance(got, torch.Tensor) else got[0]),
        (want if isinstance(want, torch.Tensor) else want[0]),
    )
    tol = 1e-3 if dtype == "fp32" else 3e-2
    # Absolute error against the output's scale: a bf16 row sum near 0 differs by a large share
    # of itself between two correct summation orders (eager's and Inductor's disagreed there too).
    scale = float(want.float().abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * max(scale, 1.0))
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def _nbytes(args: Sequence[torch.Tensor], out: Any) -> int:
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return sum(t.numel() * t.element_size() for t in (*args, *outs))


def run_workload(w: Workload, bench: Bench, copy_bps: float) -> dict[str, Any]:
    fn, args = w.make(bench.sizes, bench.device, DTYPES[w.dtype])
    want = fn(*args)
    results = {name: Result() for name in CONTENDERS}
    callables = {name: c for name in CONTENDERS if (c := _prepare(name, fn, args, want, w, bench, results[name]))}
    samples: dict[str, list[float]] = {n: [] for n in callables}
    order = list(callables)
    for rep in range(bench.sizes.reps):  # interleaved: drift hits every contender alike
        if rep >= 3 and bench.left_s() < 0:
            break
        for name in order[rep % len(order) :] + order[: rep % len(order)] if order else []:
            samples[name].append(bench.timer.per_call(callables[name], bench.sizes.calls))
    nbytes = _nbytes(args, want)
    for name, s in samples.items():
        r = results[name]
        r.median_us, r.min_us = statistics.median(s) * 1e6, min(s) * 1e6
        if w.family == "memory" and copy_bps > 0:
            r.pct_copy_bw = 100.0 * nbytes / (statistics.median(s) * copy_bps)
    return {"name": w.name, "family": w.family, "dtype": w.dtype, "bytes": nbytes, "results": _plain(results)}


def _prepare(
    name: str, fn: Callable[..., Any], args: tuple[torch.Tensor, ...], want: Any, w: Workload, bench: Bench, r: Result
) -> Callable[[], Any] | None:
    """The contender compiled, warmed up and checked into `r`; None when it cannot be timed. A
    mismatch against eager is recorded (not ok) and still timed."""
    if bench.left_s() < 0:
        r.error = "skipped: time budget spent"
        return None
    try:
        t = time.perf_counter()
        c = _compile(name, fn, args, bench)
        for _ in range(3):  # warm-up; with graphs: the warm-up call, the capture, a replay
            got = c(*args)
        r.compile_s, r.cuda_graphs = time.perf_counter() - t, _graph_note(c)
    except Exception as e:  # one contender's failure is a result, not the end of the run
        r.error = _error(e)
        return None
    try:
        r.max_err = _check(got, want, w.dtype)
        r.ok = True
    except Exception as e:
        r.error = "mismatch: " + _error(e)
    return lambda: c(*args)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def _plain(results: dict[str, Result]) -> dict[str, dict[str, Any]]:
    return {n: asdict(r) for n, r in results.items()}


def copy_bandwidth(bench: Bench) -> dict[str, float]:
    """Bytes per second of `dst.copy_(src)` (read + write) over `copy_bytes`."""
    n = bench.sizes.copy_bytes // 4
    src, dst = torch.randn(n, device=bench.device), torch.empty(n, device=bench.device)
    dst.copy_(src)
    times = [bench.timer.per_call(lambda: dst.copy_(src), max(bench.sizes.calls, 1)) for _ in range(5)]
    t = statistics.median(times)
    return {"bytes": 2 * n * 4, "seconds": t, "gbps": 2 * n * 4 / t / 1e9}


def overhead(bench: Bench) -> dict[str, Any]:
    """Per-call time of a tiny graph (launch overhead dominates): eager, vfuse's launches, one
    replay with its output clones (`vfuse_graphs`; the same input tensors each call, so since
    2026-12-01 they are held in place, not copied), and the replay alone (`vfuse_graphs_static`:
    inputs are parameters, outputs static, so nothing is copied)."""
    fn = MEMORY["add_mul_relu"][0]
    args = (torch.randn(1, 256, device=bench.device), torch.randn(1, 256, device=bench.device))
    out: dict[str, Any] = {}
    for name in ("eager", "vfuse", "vfuse_graphs", "vfuse_graphs_static"):
        if bench.left_s() < 0:
            out[f"{name}_us"], out[f"{name}_error"] = None, "skipped: time budget spent"
            continue
        try:
            c, a = _overhead_contender(name, fn, args, bench)
            for _ in range(3):
                c(*a)
            times = [bench.timer.per_call(lambda c=c, a=a: c(*a), max(bench.sizes.calls, 1) * 10) for _ in range(5)]
            out[f"{name}_us"] = statistics.median(times) * 1e6
        except Exception as e:
            out[f"{name}_us"] = None
            out[f"{name}_error"] = _error(e)
    launch, replay = out.get("vfuse_us"), out.get("vfuse_graphs_us")
    out["replay_saves_us"] = launch - replay if launch is not None and replay is not None else None
    return out


def _overhead_contender(
    name: str, fn: Callable[..., Any], args: tuple[torch.Tensor, ...], bench: Bench
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    if name != "vfuse_graphs_static":
        c = _compile(name, fn, args, bench)
    else:
        import vfuse

        args = tuple(_param(a) for a in args)
        c = vfuse.compile(fn, args, backend="triton", target=bench.target, static_outputs=True)
        if bench.device.type == "cpu":  # smoke: the capture path on the host
            from vfuse.runtime.cudagraphs import ReplayDriver

            c.compiled.executor.driver, c.compiled.executor.graph_devices = ReplayDriver, ("cpu",)
    if name.startswith("vfuse_graphs"):  # the replay itself, even where the cost model would launch
        c.compiled.executor.replay_cost = None
    return c, args


def _device_facts(device: torch.device) -> tuple[dict[str, Any], str]:
    facts: dict[str, Any] = {"type": device.type, "torch": torch.__version__}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    target = "h100"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        facts["name"], facts["sm"] = name, "{}{}".format(*torch.cuda.get_device_capability(device))
        target = next((t for key, t in PRESETS.items() if key in name), target)
    else:
        facts["name"], facts["sm"] = "cpu (smoke: Triton's interpreter)", None
    facts["target"] = target
    return facts, target


def run(device: str, smoke: bool, names: Sequence[str] | None, budget_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    dev = torch.device(device)
    facts, target = _device_facts(dev)
    timer: Timer = CudaTimer() if dev.type == "cuda" else HostTimer()
    bench = Bench(dev, SMOKE if smoke else GPU, timer, target, start + budget_s)
    chosen = [w for w in WORKLOADS if not names or w.name in names]
    unknown = sorted(set(names or ()) - {w.name for w in WORKLOADS})
    if unknown:
        raise ValueError(
            f"unknown device workload(s) {', '.join(unknown)}; known: {', '.join(w.name for w in WORKLOADS)}"
        )
    copy = copy_bandwidth(bench)
    calls = overhead(bench)  # first: cheap, and its replay figure is a bar of its own
    rows = [run_workload(w, bench, copy["gbps"] * 1e9) for w in chosen]
    report = {
        "schema": SCHEMA,
        "device": facts,
        "smoke": smoke,
        "budget_s": budget_s,
        "contenders": list(CONTENDERS),
        "copy": copy,
        "workloads": rows,
        "overhead": calls,
    }
    report["elapsed_s"] = time.perf_counter() - start
    report["ok"] = all(r["ok"] or r["error"].startswith("skipped") for w in rows for r in w["results"].values())
    return report


def summary(report: dict[str, Any]) -> str:
    lines = [f"copy {report['copy']['gbps']:.1f} GB/s on {report['device']['name']}"]
    for w in report["workloads"]:
        cells = []
        for name, r in w["results"].items():
            t = f"{r['median_us']:.1f}us" if r["median_us"] is not None else (r["error"][:40] or "-")
            pct = f" ({r['pct_copy_bw']:.0f}% copy)" if r["pct_copy_bw"] is not None else ""
            cells.append(f"{name} {t}{pct}")
        lines.append(f"{w['name']:<22} " + " | ".join(cells))
    o = report["overhead"]
    lines.append("per call (tiny graph): " + ", ".join(f"{k} {v:.1f}" for k, v in o.items() if isinstance(v, float)))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`vfuse bench --device cuda|cpu [--smoke] [--workloads a,b] [--json path] [--budget-s s]`."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print("vfuse bench: --device cuda needs a CUDA GPU (use --device cpu --smoke on a machine without one)")
        return 2
    smoke = bool(args.smoke) or args.device == "cpu"
    try:
        report = run(args.device, smoke, args.workloads, args.budget_s)
    except ValueError as e:
        print(f"vfuse bench: {e}")
        return 2
    print(summary(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
        print(f"wrote {args.json}")
    return 0 if report["ok"] else 1


def _json_default(x: object) -> object:
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)
