"""Per-kernel GPU times of chosen device-bench workloads, for vfuse and Inductor side by side.

    python benchmarks/device_profile.py gpt2_block conv_bn_relu [--calls 20]

Runs on a lent GPU (benchmarks/device_check.sh calls it after the bench): each workload from
`vfuse.bench.device` at the bench's sizes, compiled by vfuse (backend="triton", graphs off so
every kernel is its own launch) and by Inductor, warmed up, then `torch.profiler` over `--calls`
calls. Prints, per contender, the kernels by total device time (name, calls, microseconds per call)
and, for vfuse, the plan's kernels with the cost model's predicted time, so a kernel that runs far
past its prediction stands out. Contraction workloads (gemm, conv, attention) are also compiled with
the library verdict forced to the template (`vfuse template`: `GPU_LIBRARY_SHARE` made infinite for
this compile only; the table's tiles, not tuned), so the template's own time stands beside cuBLAS /
cuDNN / flash SDPA: their ratio is the share `fusion/library.py` should hold. CPU-only machines: exits with a message.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from vfuse import compile as vfuse_compile
from vfuse.bench import device as bench


def _kernels(fn: Any, args: tuple[torch.Tensor, ...], calls: int) -> list[tuple[str, int, float]]:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    rows = [
        (e.key, e.count, e.device_time_total / calls)
        for e in prof.key_averages()
        if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA
    ]
    return sorted(rows, key=lambda r: -r[2])


def _print(title: str, rows: list[tuple[str, int, float]]) -> None:
    print(f"-- {title}: {sum(r[2] for r in rows):.1f} us per call on the device")
    for name, count, us in rows[:20]:
        print(f"   {us:9.1f} us  x{count:<5} {name[:110]}")


@contextlib.contextmanager
def _template_forced() -> Iterator[None]:
    """The GPU library verdict never picks the library while compiling (measurement only)."""
    from vfuse.fusion import library

    saved = dict(library.GPU_LIBRARY_SHARE)
    library.GPU_LIBRARY_SHARE.update({k: math.inf for k in saved})
    try:
        yield
    finally:
        library.GPU_LIBRARY_SHARE.update(saved)


def _template(fn: Any, args: tuple[torch.Tensor, ...], target: str, calls: int) -> None:
    try:
        with _template_forced():
            # the table's tiles: tuning 8 candidates would not fit device_check.sh's 150 s
            compiled = vfuse_compile(fn, args, backend="triton", target=target, cuda_graphs=False, autotune=False)
        _print("vfuse template (library verdict off, table tiles)", _kernels(compiled, args, calls))
    except Exception as e:
        print(f"   vfuse template failed: {type(e).__name__}: {e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="+")
    p.add_argument("--calls", type=int, default=20)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("device_profile: needs a CUDA GPU")
        return 2
    import vfuse

    dev = torch.device("cuda")
    target = bench._device_facts(dev)[1]
    by_name = {w.name: w for w in bench.WORKLOADS}
    for name in a.workloads:
        w = by_name[name]
        fn, args = w.make(bench.GPU, dev, bench.DTYPES[w.dtype])
        print(f"== {name}")
        try:
            compiled = vfuse.compile(fn, args, backend="triton", target=target, cuda_graphs=False)
            _print("vfuse", _kernels(compiled, args, a.calls))
            report = vfuse.explain(fn, *args, backend="triton", target=target)
            for k in report.kernels:
                print(f"   predicted {(k.time_s or 0) * 1e6:9.1f} us  {k.name:<8} {k.runs.value:<9} {k.pattern[:70]}")
        except Exception as e:  # one contender's failure is a result
            print(f"   vfuse failed: {type(e).__name__}: {e}")
        if w.family in ("gemm", "conv", "attention"):
            _template(fn, args, target, a.calls)
        try:
            _print("inductor", _kernels(torch.compile(fn, dynamic=False), args, a.calls))
        except Exception as e:
            print(f"   inductor failed: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
