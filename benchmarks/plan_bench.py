"""Time the fusion planner on a random 10,000-op graph (target: well under 1 s).

    .venv/bin/python benchmarks/plan_bench.py [--ops 10000] [--seed 0] [--target cpu]

The graph mimics lowered models: mostly pointwise chains with skip connections and broadcast
parameters, row reductions (norms, softmax), matmuls, and views. `--fanout-window 50` reads
operands from further back, a denser and slower (superlinear) case than real models.
"""

from __future__ import annotations

import argparse
import random
import time

from vfuse.fusion import plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType
from vfuse.targets import get_target

ROWS, D = 256, 512
UNARY = (Op.RELU, Op.EXP, Op.TANH, Op.NEG, Op.SIGMOID, Op.SILU)
BINARY = (Op.ADD, Op.MUL, Op.SUB, Op.MAXIMUM)


def _step(b: GraphBuilder, rng: random.Random, live: list[str], params: list[str], weight: str, window: int) -> str:
    """Append one op reading the latest value (so chains form) and sometimes a recent one
    (fan-out and skip connections, like residual streams)."""
    x = live[-1] if rng.random() < 0.85 else rng.choice(live[-window:])
    r = rng.random()
    if r < 0.35:
        return b.add(rng.choice(UNARY), (x,))
    if r < 0.7:
        other = rng.choice(live[-window:] + params)
        return b.add(rng.choice(BINARY), (x, other))
    if r < 0.8:
        s = b.add(rng.choice((Op.SUM, Op.AMAX)), (x,), axes=(1,), keepdim=True)
        return b.add(Op.SUB, (x, s))
    if r < 0.85:
        return b.add(Op.MATMUL, (x, weight))
    if r < 0.9:
        t = b.add(Op.PERMUTE, (x,), perm=(1, 0))
        return b.add(Op.PERMUTE, (b.add(Op.RELU, (t,)),), perm=(1, 0))
    c = b.add(Op.FULL, value=rng.random(), shape=(), dtype=DType.F32)
    return b.add(Op.MUL, (x, c))


def random_graph(ops: int, seed: int, window: int = 8) -> Graph:
    rng = random.Random(seed)
    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((ROWS, D), DType.F32))
    w = b.add(Op.INPUT, name="w", index=1, type=TensorType((D, D), DType.F32))
    params = [b.add(Op.INPUT, name=f"p{i}", index=2 + i, type=TensorType((D,), DType.F32)) for i in range(4)]
    live = [x]
    while len(b._nodes) < ops:
        live.append(_step(b, rng, live, params, w, window))
    return b.build([live[-1]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--fanout-window", type=int, default=8)
    args = ap.parse_args()
    graph = random_graph(args.ops, args.seed, args.fanout_window)
    target = get_target(args.target)
    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_fusion(graph, target)
    # CPU time too: on a shared machine wall time includes time spent descheduled
    dt, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    accepted = sum(d.accepted for d in plan.decisions)
    print(
        f"{len(graph)} nodes -> {len(plan.groups)} kernels on {target.name}; "
        f"{accepted} merges, {len(plan.decisions) - accepted} rejections; "
        f"planned in {dt:.3f} s wall, {cpu_s:.3f} s CPU"
    )


if __name__ == "__main__":
    main()
