"""Training steps of the written-out attention workloads of `vfuse bench --train` (gpt2_block, attention),
interleaved: eager, Inductor, vfuse (written-out attention rewritten into SDPA before AOTAutograd:
entry/attention_rewrite.py) and vfuse with the rewrite off (the cost model overridden), one step of each
per round, rotating the order. Median and min step ms; first step's loss and gradients checked by
bench/train.py's trainer against eager.

    .venv/bin/python benchmarks/attention_train_bench.py [--rounds 15] [--threads 2] [--workloads gpt2_block,attention]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vfuse.bench import train
from vfuse.entry import attention_rewrite

CONTENDERS = ("eager", "inductor", "vfuse", "vfuse-written")


def _build(name: str, contender: str) -> train._Trainer:
    model, inputs = train.WORKLOADS[name][1](False)
    model = train._no_dropout(model)
    if contender != "vfuse-written":
        return train._trainer(model, inputs, contender, strict=True)
    costs = attention_rewrite.costs
    attention_rewrite.costs = lambda *a: (0.0, 1.0)  # the written-out form "always faster"
    try:
        tr = train._trainer(model, inputs, "vfuse", strict=True)
        tr.step()  # compiles under the override
    finally:
        attention_rewrite.costs = costs
    return tr


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", default="gpt2_block,attention")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.workloads.split(","):
        trainers = {c: _build(name, c) for c in CONTENDERS}
        for tr in trainers.values():
            for _ in range(3):
                tr.step()
        times: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(args.rounds):
            order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
            for c in order:
                t0 = time.perf_counter()
                trainers[c].step()
                times[c].append(time.perf_counter() - t0)
        eager = statistics.median(times["eager"])
        print(f"{name}: {train.WORKLOADS[name][0]}")
        for c in CONTENDERS:
            med = statistics.median(times[c])
            extra = ""
            if trainers[c].backend is not None:
                saved = sum(p.saved_bytes for p in trainers[c].backend.remat) / 2**20
                rewritten = [d.rewritten for d in trainers[c].backend.attention]
                extra = f"  saved {saved:.2f} MiB, attention rewritten {rewritten}"
            print(f"  {c:14s} {med * 1e3:8.2f} ms (min {min(times[c]) * 1e3:8.2f})  {eager / med:5.2f}x eager{extra}")


if __name__ == "__main__":
    main()
