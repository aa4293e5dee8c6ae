"""One training step (forward, backward, AdamW) of a self-attention block with attention dropout 0.1,
eager vs Inductor vs vfuse: one-thread CPU time per step (process_time, interleaved rounds: robust to
other processes on the machine) and the step's peak of torch's CPU allocations.

  sdpa:    qkv proj, causal F.scaled_dot_product_attention(dropout_p=0.1), out proj; B=4 T=256 d=256 4 heads
  written: the same with softmax(q k^T s + causal) -> nn.Dropout(0.1) -> @ v written out (HF eager / GPT-2)

vfuse rewrites both into its attention_dropout (flash kernels, mask from its counter RNG); torch takes
its math path (N x N probabilities and mask kept for the backward). Run with PYTHONPATH pointing at an
older checkout for an A/B of vfuse itself.

    .venv/bin/python benchmarks/attention_dropout_bench.py [--rounds 10] [--threads 1] [--workloads sdpa,written]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vfuse.bench import train

CONTENDERS = ("eager", "inductor", "vfuse")
P = 0.1


class DropoutSdpa(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=P if self.training else 0.0, is_causal=True)


class DropoutWritten(nn.Module):
    def __init__(self, t: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(P)
        self.register_buffer("tril", torch.ones(t, t, dtype=torch.bool).tril())

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        s = s.masked_fill(~self.tril, float("-inf"))
        return self.drop(F.softmax(s, dim=-1)) @ v


def _build(name: str, contender: str, quick: bool) -> train._Trainer:
    gen = torch.Generator().manual_seed(0)
    b, t, d, h = (1, 16, 32, 2) if quick else (4, 256, 256, 4)
    attn = DropoutSdpa() if name == "sdpa" else DropoutWritten(t)
    model = train.SelfAttention(gen, d, h, attn).train()
    return train._trainer(model, (torch.randn(b, t, d, generator=gen),), contender, strict=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workloads", default="sdpa,written")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.workloads.split(","):
        trainers = {c: _build(name, c, args.quick) for c in CONTENDERS}
        for tr in trainers.values():
            for _ in range(3):
                tr.step()
        cpu: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(args.rounds):
            for c in CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]:
                t0 = time.process_time()
                trainers[c].step()
                cpu[c].append(time.process_time() - t0)
        print(f"{name}: attention dropout {P}, {args.threads} thread(s), {args.rounds} rounds")
        eager = statistics.median(cpu["eager"])
        for c in CONTENDERS:
            med, peak = statistics.median(cpu[c]), train.step_peak_bytes(trainers[c].step) / 2**20
            extra = ""
            if trainers[c].backend is not None:
                saved = sum(p.saved_bytes for p in trainers[c].backend.remat) / 2**20
                rewritten = [d.rewritten for d in trainers[c].backend.attention]
                extra = f"  saved {saved:.2f} MiB, attention rewritten {rewritten}"
            print(f"  {c:9s} cpu {med * 1e3:8.2f} ms (min {min(cpu[c]) * 1e3:8.2f})  {eager / med:5.2f}x eager"
                  f"  peak {peak:7.2f} MiB{extra}")  # fmt: skip


if __name__ == "__main__":
    main()
