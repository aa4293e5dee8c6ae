"""vfuse.compile's per-call path stays short (issue 16: within 2x of the torch.compile path).

Counted, not timed: the Python frames one call enters, and no read of ExportedProgram.call_spec
(each read builds a new NamedTuple class, which once cost half a millisecond per call).
benchmarks/call_overhead.py times the same comparison.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram

import vfuse


def tiny(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2 + 1


def frames_of_one_call(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> list[str]:
    """The Python functions one (warm) call of `fn` enters."""
    fn(x)
    entered: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            entered.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = fn(x)
    finally:
        sys.setprofile(None)
    torch.testing.assert_close(out, tiny(x))
    return entered


@pytest.mark.parametrize("grad", [False, True])
def test_a_call_enters_at_most_half_the_frames_of_the_torch_compile_path(grad: bool) -> None:
    torch._dynamo.reset()
    x = torch.randn(7)
    with torch.set_grad_enabled(grad):
        aot = frames_of_one_call(vfuse.compile(tiny, [x]), x)
        dynamo = frames_of_one_call(torch.compile(tiny, backend="vfuse", dynamic=False), x)
    # Today 10 against 38 (grad off) and 13 against 48 (grad on); one read of call_spec adds 24.
    assert 2 * len(aot) <= len(dynamo), (aot, dynamo)


def test_a_call_does_not_read_the_call_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(7)
    compiled = vfuse.compile(tiny, [x])
    reads = []
    original = ExportedProgram.call_spec

    def counted(self: ExportedProgram) -> Any:
        reads.append(1)
        return original.fget(self)

    monkeypatch.setattr(ExportedProgram, "call_spec", property(counted))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), tiny(x))
    assert reads == []
