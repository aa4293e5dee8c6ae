"""DistributedDataParallel (gloo, two processes on this machine) around a model compiled with
backend="vfuse" trains with eager DDP's losses. Dynamo's DDPOptimizer splits the forward graph
at the gradient buckets' boundaries (the smallest cap makes two), so vfuse compiles each
piece, and the backward's all-reduce hooks run between vfuse's backward graphs."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.training.ddp_worker import WORLD, worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gloo_available() -> bool:
    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not _gloo_available(), reason="torch.distributed without gloo")
def test_ddp_compiled_with_vfuse_trains_as_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the spawned ranks talk over loopback
    mp.spawn(worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for r in results:
        # fp32 GEMMs in another summation order: the losses agree to fp32 rounding over the steps.
        assert r["compiled"] == pytest.approx(r["eager"], rel=1e-5), r
        stats = r["stats"]
        assert stats["eager_graphs"] == 0 and stats["reference_graphs"] == 0, stats
        # A forward graph per bucket piece (two) and a backward graph for each.
        assert stats["graphs"] >= 4, stats
    assert results[0]["eager"] != results[1]["eager"]  # the ranks trained on their own data
    assert results[0]["eager"][-1] < results[0]["eager"][0]  # and the model learned
