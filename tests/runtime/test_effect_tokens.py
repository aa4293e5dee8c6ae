"""Graphs with an effect token (torch.linalg's ops under AOTAutograd take one, passed as None at run
time) run through torch.compile(backend="vfuse") instead of failing on the None (found by the fuzzer)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "inv": lambda a: torch.linalg.inv(a) * 2,
    "solve": lambda a: torch.linalg.solve(a, a.sum(0)) + 1,
    "cholesky": lambda a: torch.linalg.cholesky(a @ a.T + torch.eye(5)).relu(),
}


@pytest.mark.parametrize("name", sorted(FNS))
def test_linalg_with_an_effect_token_matches_eager(name: str) -> None:
    fn = FNS[name]
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(1)) + 5 * torch.eye(5)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="vfuse")(a), fn(a), rtol=1e-5, atol=1e-5)
