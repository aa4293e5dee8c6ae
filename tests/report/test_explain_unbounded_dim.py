"""`vfuse.explain` over a `Dim` without a maximum: torch bounds it with `int_oo`, whose `is_finite`
is True, and `int(int_oo)` raised inside the report (a crash on the plainest dynamic export)."""

import torch
from torch.export import Dim

import vfuse


def test_explain_names_an_unbounded_dim_range() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 2)

    report = vfuse.explain(f, torch.randn(64, 32), dynamic_shapes={"x": {0: Dim("b")}})
    (line,) = report.symbols
    assert line.endswith("= 64 here (2..inf)"), line


def test_explain_names_a_bounded_dim_range() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1

    report = vfuse.explain(f, torch.randn(5, 3), dynamic_shapes={"x": {0: Dim("b", min=3, max=99)}})
    (line,) = report.symbols
    assert line.endswith("= 5 here (3..99)"), line
