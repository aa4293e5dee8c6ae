"""What is live at the peak of one training step (the bench's peak, `vfuse bench --train`).

    .venv/bin/python benchmarks/train_peak.py <workload or model> [eager|inductor|vfuse] [--threads N]

Walks torch's profiler allocation events (pointer, size, the ops around each) of one step after
three warm-up steps, finds the step's peak and lists the allocations live there (>= 64 KiB) with
the op that made them; vfuse's retained bytes (idle arenas and output-pool buffers) are printed apart.
"""

from __future__ import annotations

import argparse

import torch

from vfuse.bench import train as T


def _walk(nodes, chain: tuple[str, ...], out: list) -> None:
    for n in nodes:
        if type(n.extra_fields).__name__ == "_ExtraFields_Allocation":
            out.append((n.start_time_ns, n.extra_fields.ptr, n.extra_fields.alloc_size, chain))
        else:
            _walk(n.children, (*chain, n.name), out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("contender", nargs="?", default="vfuse")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    build = T.WORKLOADS[args.name][1] if args.name in T.WORKLOADS else T._from_model(args.name)
    model, inputs = build(False)
    tr = T._trainer(T._no_dropout(model), inputs, args.contender, strict=False)
    for _ in range(3):
        tr.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        tr.step()
    events: list = []
    _walk(prof.profiler.kineto_results.experimental_event_tree(), (), events)
    events.sort(key=lambda e: e[0])
    live: dict = {}
    cur = peak = 0
    snap: dict = {}
    for t, ptr, size, chain in events:
        if size > 0:
            live[ptr] = (size, chain, t)
        else:
            live.pop(ptr, None)
        cur += size
        if cur > peak:
            peak, snap = cur, dict(live)
    kept = T.retained_bytes(tr.backend)
    print(f"{args.name} {args.contender}: step peak {peak / 2**20:.2f} MiB, retained {kept / 2**20:.2f} MiB")
    t0 = events[0][0] if events else 0
    for size, chain, t in sorted(snap.values(), key=lambda v: v[2]):
        if size >= 64 * 1024:
            print(f"  {size / 2**20:7.3f} MiB  t={(t - t0) / 1e6:8.2f} ms  {' > '.join(chain[-5:])}")


if __name__ == "__main__":
    main()
