"""The small row graph of the dynamic overhead tests: the bench's tiny_graph form (pointwise ops
and row means on short rows), fewer iterations."""

from __future__ import annotations

import torch


class RowChain(torch.nn.Module):
    """tiny_graph's body, fewer iterations: tanh(x*y+0.5) then the row mean subtracted."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(x * y + 0.5)
            x = x - x.mean(-1, keepdim=True)
        return x
