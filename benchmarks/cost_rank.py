"""How well does the cost model rank single ops on this CPU? Spearman correlation between the
predicted time of ~30 ops of varied kinds and sizes and their measured time in the reference
executor (torch ops, `vfuse.interp.executor.run_node`).

    .venv/bin/python benchmarks/cost_rank.py

The reference executor is torch eager, not vfuse's generated kernels, so this checks the
model's shape (launch floor, bandwidth and flop slopes), not its constants for our codegen.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vfuse.fusion import estimate
from vfuse.interp.executor import run_node
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType
from vfuse.targets import get_target

F32 = DType.F32


def _graph(shapes: list[tuple[int, ...]], op: Op, **attrs: object) -> Graph:
    b = GraphBuilder()
    ins = [b.add(Op.INPUT, name=f"x{i}", index=i, type=TensorType(s, F32)) for i, s in enumerate(shapes)]
    return b.build([b.add(op, ins, name="op", **attrs)])


def cases() -> list[tuple[str, Graph]]:
    out: list[tuple[str, Graph]] = []
    for n in (1 << 10, 1 << 16, 1 << 20, 1 << 22):
        out.append((f"add {n}", _graph([(n,), (n,)], Op.ADD)))
        out.append((f"exp {n}", _graph([(n,)], Op.EXP)))
        out.append((f"gelu {n}", _graph([(n,)], Op.GELU, approximate="none")))
        out.append((f"relu {n}", _graph([(n,)], Op.RELU)))
        out.append((f"rowsum {n}", _graph([(n // 256, 256)], Op.SUM, axes=(1,), keepdim=True)))
    for m in (32, 128, 256, 512):
        out.append((f"matmul {m}", _graph([(m, m), (m, m)], Op.MATMUL)))
    for c, hw in ((8, 16), (32, 32), (64, 56)):
        conv = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
        out.append((f"conv c{c} {hw}x{hw}", _graph([(1, c, hw, hw), (c, c, 3, 3)], Op.CONV2D, **conv)))
    for t in (64, 256):
        out.append((f"sdpa t{t}", _graph([(8, t, 64)] * 3, Op.SDPA, scale=None, causal=False, gqa=False)))
    return out


def measure_all(graphs: list[Graph], rounds: int = 7, budget_s: float = 0.02) -> list[float]:
    """Best time of each op over `rounds` round-robin passes: on a shared machine a burst of
    contention then spoils one pass of every op instead of all passes of one op."""
    nodes = [g["op"] for g in graphs]
    args = [[torch.randn(n.tensor_type.shape) for n in g.inputs] for g in graphs]
    best = [float("inf")] * len(graphs)
    for _ in range(rounds):
        for i, (node, a) in enumerate(zip(nodes, args, strict=True)):
            run_node(node, a)  # warm up caches and lazy init
            t_end = time.perf_counter() + budget_s
            while True:
                t0 = time.perf_counter()
                run_node(node, a)
                t1 = time.perf_counter()
                best[i] = min(best[i], t1 - t0)
                if t1 > t_end:
                    break
    return best


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    return r


def spearman(a: list[float], b: list[float]) -> float:
    return float(np.corrcoef(_ranks(np.array(a)), _ranks(np.array(b)))[0, 1])


def main() -> None:
    target = get_target("cpu")
    named = cases()
    measured = measure_all([g for _, g in named])
    rows = [(name, estimate(["op"], g, target).time_s, m) for (name, g), m in zip(named, measured, strict=True)]
    for name, pred, meas in rows:
        print(f"{name:20s} predicted {pred * 1e6:10.2f} us   measured {meas * 1e6:10.2f} us")
    rho = spearman([r[1] for r in rows], [r[2] for r in rows])
    print(f"target: {target.source}; {len(rows)} ops; Spearman rank correlation = {rho:.3f}")


if __name__ == "__main__":
    main()
