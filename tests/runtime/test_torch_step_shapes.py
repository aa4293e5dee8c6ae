"""A torch step's result feeds kernels through a raw pointer at its planned shape and dtype
(runtime/steps.py): a result of any other shape or dtype (a shape rule that disagrees with torch)
is a clear error naming the node, never an out-of-bounds read."""

from __future__ import annotations

import pytest
import torch

import vfuse
from vfuse import interp
from vfuse.schedule import TorchStep


class SortThenKernel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sort(x * 2, dim=-1).values) + 1


def _compiled() -> tuple[torch.nn.Module, str]:
    torch._dynamo.reset()
    backend = vfuse.backend()
    fn = torch.compile(SortThenKernel(), backend=backend)
    x = torch.randn(5, 7)
    torch.testing.assert_close(fn(x), SortThenKernel()(x))
    ex = backend.compiled[-1].executor
    fed = [n for s in ex.program.steps if isinstance(s, TorchStep) for n in s.nodes if n in ex.program.buffers]
    assert fed, "no torch step feeds a kernel"
    return fn, fed[0]


@pytest.mark.parametrize("wrong", ["shape", "dtype"])
def test_a_torch_result_unlike_the_plan_is_an_error_naming_its_node(
    monkeypatch: pytest.MonkeyPatch, wrong: str
) -> None:
    fn, name = _compiled()
    real = interp.run_node

    def run_node(node, args):  # type: ignore[no-untyped-def]
        out = real(node, args)
        if node.name != name:
            return out
        return out[:, :3] if wrong == "shape" else out.double()

    monkeypatch.setattr(interp, "run_node", run_node)
    with pytest.raises(RuntimeError, match=rf"%{name} .*planned \(5, 7\) torch.float32"):
        fn(torch.randn(5, 7))
