"""What is live at the peak of one training step (the bench's peak, `vfuse bench --train`).

    .venv/bin/python benchmarks/train_peak.py <workload or model> [eager|inductor|vfuse] [--threads N]

Walks torch's profiler allocation events (pointer, size, the ops around each) of one step after
three warm-up steps, finds the step's peak and lists the allocations live there (>= 64 KiB) with
the op that made them; vfuse's retained bytes (idle arenas and output-pool buffers) are printed apart.
Blocks that are a parameter's `.grad` after the step are marked `grad`: the bench counts them in
`state` too, and only eager and Inductor allocate them during the step (`zero_grad(set_to_none=True)`
freed the last ones); vfuse writes them into output-pool buffers held across steps (`held grads`:
in neither its step peak nor its retained bytes, as they are a `.grad` when those are measured).
The other figures compare alike: the bench's peak with no contender's gradients in it (the step's
highest sum leaving the grad blocks out), and all bytes live at the peak but weights and optimizer
state (vfuse's held grads added).
"""

from __future__ import annotations

import argparse

import torch

from vfuse.bench import train as T


def _peak(events: list, skip: set) -> tuple[int, dict]:
    """The most bytes allocated in the step and live at once, as the bench counts them (a free
    counts only for a block allocated in the step, T.step_peak_bytes), and the blocks live then,
    leaving out the blocks in `skip` ((address, allocation time) pairs)."""
    live: dict = {}
    cur = peak = 0
    snap: dict = {}
    for t, ptr, size, chain in events:
        if size > 0 and (ptr, t) in skip:
            continue
        if size > 0:
            cur += size - live.get(ptr, (0,))[0]
            live[ptr] = (size, chain, t)
        elif ptr in live:
            cur -= live.pop(ptr)[0]
        if cur > peak:
            peak, snap = cur, dict(live)
    return peak, snap


def _grad_blocks(events: list, model: torch.nn.Module) -> set:
    """(address, allocation time) of the step's blocks that are a parameter's `.grad` after it:
    the last block allocated at its address (an earlier one there was freed before it)."""
    last = {ptr: t for t, ptr, size, _ in events if size > 0}
    ptrs = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
    return {(ptr, last[ptr]) for ptr in ptrs if ptr in last}


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
    events = T.allocation_events(prof)
    peak, snap = _peak(events, set())
    grads = _grad_blocks(events, tr.model)
    no_grads, _ = _peak(events, grads)
    kept = T.retained_bytes(tr.backend)
    held = 0  # vfuse: gradient buffers of its output pool, held through the whole step
    if args.contender == "vfuse":
        # by storage: gradients stored into donated saved activations share their buffers (schedule/donate.py);
        # the step's own gradient blocks (an arena the gradients live in, runtime/arena_outputs.py) are in its peak
        made = {ptr for ptr, _ in grads}
        storages = {
            g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
            for g in (p.grad for p in tr.model.parameters() if p.grad is not None)
            if g.untyped_storage().data_ptr() not in made
        }
        held = sum(storages.values())
    mib = 2**20
    print(
        f"{args.name} {args.contender}: step peak {peak / mib:.2f} MiB, retained {kept / mib:.2f}, "
        f"bench peak {(peak + kept) / mib:.2f}; without grads {(no_grads + kept) / mib:.2f}; "
        f"held grads {held / mib:.2f}, all live but weights and optimizer state {(peak + kept + held) / mib:.2f}"
    )
    t0 = events[0][0] if events else 0
    for ptr, (size, chain, t) in sorted(snap.items(), key=lambda v: v[1][2]):
        if size >= 64 * 1024:
            mark = " grad" if (ptr, t) in grads else ""
            print(f"  {size / mib:7.3f} MiB{mark}  t={(t - t0) / 1e6:8.2f} ms  {' > '.join(chain[-5:])}")


if __name__ == "__main__":
    main()
