"""Reduction lowerings against eager: every reduction over several axis sets, keepdim, dtype
arguments, integer/bool inputs, non-contiguous and zero-size inputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tests.frontend.lowering_helpers import check, ops_of

from vfuse.ir import Op

DIMS = [None, 0, -1, (0, 2), (1, 2), (0, 1, 2)]


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    return (torch.randn(4, 3, 5, generator=g) * 2).permute(1, 0, 2)  # non-contiguous (3, 4, 5)


def _over(red: Callable, takes_tuple: bool = True) -> Callable:
    """red applied over every entry of DIMS (single dims only if the op takes one dim)."""

    def fn(x: torch.Tensor) -> tuple:
        outs = []
        for d in DIMS:
            if d is None:
                outs.append(red(x))
            elif isinstance(d, int) or takes_tuple:
                outs += [red(x, d), red(x, d, keepdim=True)]
        return tuple(outs)

    return fn


REDUCTIONS: list[tuple[str, Callable, bool]] = [
    ("sum", torch.sum, True), ("mean", torch.mean, True), ("amax", lambda x, *d, **k: torch.amax(x, *d, **k), True),
    ("amin", lambda x, *d, **k: torch.amin(x, *d, **k), True), ("prod", torch.prod, False),
    ("var", torch.var, True), ("std", torch.std, True),
    ("logsumexp", lambda x, d=(0, 1, 2), **k: torch.logsumexp(x, d, **k), True),
    ("var_corr0", lambda x, *d, **k: torch.var(x, *d, correction=0, **k), True),
    ("std_corr2", lambda x, *d, **k: torch.std(x, *d, correction=2, **k), True),
    ("any", lambda x, *d, **k: torch.any(x > 1, *d, **k), True),
    ("all", lambda x, *d, **k: torch.all(x > -3, *d, **k), True),
    ("argmax", lambda x, *d, **k: torch.argmax(x, *d, **k), False),
    ("argmin", lambda x, *d, **k: torch.argmin(x, *d, **k), False),
    ("max_values", lambda x, *d, **k: torch.max(x, *d, **k)[0] if d else torch.max(x), False),
    ("max_indices", lambda x, *d, **k: torch.max(x, *d, **k)[1] if d else torch.max(x), False),
    ("min_both", lambda x, *d, **k: tuple(torch.min(x, *d, **k)) if d else torch.min(x), False),
]  # fmt: skip


@pytest.mark.parametrize(("name", "red", "takes_tuple"), REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction(name: str, red: Callable, takes_tuple: bool) -> None:
    check(_over(red, takes_tuple), _x())


def test_reduction_dtype_arguments_and_int_promotion() -> None:
    i = torch.randint(-5, 6, (3, 4), dtype=torch.int32)
    b = torch.rand(3, 4) > 0.5
    x = torch.randn(3, 4)
    check(
        lambda i, b, x: (i.sum(), i.sum(1), b.sum(0), i.prod(1), x.sum(1, dtype=torch.float64),
                         i.mean(0, dtype=torch.float32), x.mean(dtype=torch.float64), i.sum(dtype=torch.int8),
                         i.amax(1), b.any(), i.all(1), i.argmax()),
        i, b, x,
    )  # fmt: skip


def test_half_statistics_accumulate_in_float() -> None:
    x = (torch.randn(8, 300) + 10).half()
    graph = check(lambda x: (x.mean(1), x.var(1), x.sum(1)), x, rtol=2e-3, atol=1e-2)
    assert any(n.op is Op.SUM and n.type.dtype.value == "f32" for n in graph.nodes)


def test_zero_size_reductions() -> None:
    e = torch.randn(0, 4)
    check(lambda e: (e.sum(0), e.sum(), e.mean(0), e.prod(0), e.amax(1), e.any(0), e.all(0), e.var(0)), e)


def test_var_correction_larger_than_count_gives_inf_like_torch() -> None:
    x = torch.randn(3, 2)
    check(lambda x: (x.var(1, correction=2), x.var(1, correction=5), x.std(0, unbiased=False)), x)


def test_var_mean_and_std_mean() -> None:
    x = _x()
    check(lambda x: (*torch.var_mean(x, (0, 2)), *torch.std_mean(x, 1, keepdim=True), *torch.var_mean(x)), x)


def test_logsumexp_all_minus_inf_row() -> None:
    x = torch.tensor([[-float("inf")] * 3, [1.0, 2.0, 3.0], [float("inf"), 0.0, 1.0]])
    check(lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, 0, keepdim=True)), x)


def test_mean_is_decomposed_into_sum_and_div() -> None:
    ops = ops_of(check(lambda x: x.mean(1), torch.randn(3, 4)))
    assert ops[Op.SUM] == 1 and ops[Op.DIV] == 1


def test_max_over_empty_dim_falls_back_to_torch() -> None:
    """Eager raises here; the lowering must not invent a value, so torch runs (and raises)."""
    from tests.frontend.lowering_helpers import fallbacks, lower_fn

    e = torch.randn(3, 0)
    graph = lower_fn(lambda e: torch.logsumexp(e, 1), [e])
    assert fallbacks(graph)
