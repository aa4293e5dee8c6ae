"""benchmarks/call_breakdown.py still reaches what it times (it swaps an executor's private entry
points, then checks the compiled call against eager): one small run of every part."""

from __future__ import annotations

import pytest
import torch
from benchmarks.call_breakdown import main


def test_every_part_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    assert main(["tiny_graph", "--threads", "1", "--rounds", "2", "--block", "2"]) == 0
    out = capsys.readouterr().out
    for part in ("full", "executor", "overhead", "around", "copy", "kernels"):
        assert f"  {part} " in out, part
    assert torch.get_num_threads() == threads  # restored
