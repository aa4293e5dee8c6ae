"""Hypothesis-generated programs of pointwise, reduction and view ops, compiled, match eager."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vfuse

UNARY: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.relu,
    torch.sigmoid,
    torch.tanh,
    torch.exp,
    torch.neg,
    torch.abs,
    lambda x: torch.nn.functional.gelu(x),
    lambda x: torch.nn.functional.silu(x),
    lambda x: x * 0.5 + 1.0,
    lambda x: torch.clamp(x, -0.5, 0.5),
    lambda x: torch.sqrt(x.abs() + 1),
]
BINARY: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = [
    torch.add,
    torch.sub,
    torch.mul,
    torch.maximum,
    torch.minimum,
    lambda a, b: torch.where(a > b, a, b * 2),
    lambda a, b: a / (b.abs() + 1),
]
REDUCE: list[Callable[[torch.Tensor, int], torch.Tensor]] = [
    lambda x, d: x.sum(d, keepdim=True),
    lambda x, d: x.mean(d, keepdim=True),
    lambda x, d: x.amax(d, keepdim=True),
    lambda x, d: torch.softmax(x, d),
    lambda x, d: x - x.var(d, keepdim=True),
    lambda x, d: torch.layer_norm(x, x.shape[-1:]),
]
VIEW: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda x: x.transpose(0, 1).contiguous().transpose(0, 1),
    lambda x: x.reshape(-1).reshape(x.shape),
    lambda x: torch.cat([x[:, :1], x[:, 1:]], dim=1),
    lambda x: x.unsqueeze(0).squeeze(0),
]

# An op step: (family, index into the family, which earlier values it reads, reduction dim).
step = st.tuples(
    st.sampled_from(["u", "b", "r", "v"]), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 1)
)


def build(steps: list[tuple[str, int, int, int, int]]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        values = [x, y]
        for fam, k, a, b, dim in steps:
            va, vb = values[a % len(values)], values[b % len(values)]
            if fam == "u":
                values.append(UNARY[k % len(UNARY)](va))
            elif fam == "b":
                values.append(BINARY[k % len(BINARY)](va, vb))
            elif fam == "r":
                values.append(REDUCE[k % len(REDUCE)](va, dim) * 1.0 + vb * 0.0)
            else:
                values.append(VIEW[k % len(VIEW)](va))
        return values[-1] + values[len(values) // 2]

    return program


# 12 random programs a run (25 until session 18: `make test` near 20 minutes; tests/fuzz draws far more).
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=8), rows=st.integers(1, 5), cols=st.integers(2, 7))
def test_random_programs_match_eager(steps: list, rows: int, cols: int) -> None:
    torch._dynamo.reset()
    program = build(steps)
    x, y = torch.randn(rows, cols), torch.randn(rows, cols)
    backend = vfuse.backend(strict=True)
    expected = program(x, y)
    got = torch.compile(program, backend=backend, fullgraph=True)(x, y)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert backend.stats["fallbacks"] == {}
