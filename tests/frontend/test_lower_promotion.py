"""Type promotion: every pair of dtypes (and 0-dim tensors, python scalars) through binary
ops must give eager's dtype and values; combinations eager rejects are skipped."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from tests.frontend.lowering_helpers import check

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]  # fmt: skip
OPS: list[tuple[str, Callable]] = [
    ("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div), ("eq", torch.eq),
    ("lt", torch.lt), ("maximum", torch.maximum), ("floor_divide", torch.floor_divide),
    ("remainder", torch.remainder), ("bitwise_or", torch.bitwise_or), ("logical_and", torch.logical_and),
    ("where", lambda a, b: torch.where(a > 1, a, b)), ("pow", torch.pow),
]  # fmt: skip


def _sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    # Values in [1, 4] keep every op defined (no zero divisors, no negative powers of ints).
    return torch.randint(1, 5, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _valid(op: Callable, a: object, b: object) -> bool:
    try:
        op(a, b)
    except (RuntimeError, TypeError):
        return False
    return True


@pytest.mark.parametrize(("name", "op"), OPS, ids=[o[0] for o in OPS])
def test_dtype_pairs_and_scalars_promote_like_torch(name: str, op: Callable) -> None:
    tensors = [_sample(d, (2, 3), i) for i, d in enumerate(DTYPES)]
    zero_dim = [_sample(d, (), 10 + i) for i, d in enumerate(DTYPES)]
    pairs = [(i, j, False) for i, j in itertools.product(range(len(DTYPES)), repeat=2)]
    pairs += [(i, j, True) for i, j in itertools.product(range(len(DTYPES)), repeat=2)]
    valid = [(i, j, z) for i, j, z in pairs if _valid(op, tensors[i], (zero_dim if z else tensors)[j])]
    # torch's meta function types pow(bool tensor, True) as int64 while eager returns bool; the
    # lowering follows the meta (it is what the graph declares), so that pair is left out.
    bools = (True,) if name != "pow" else ()
    scalars = [(i, s) for i in range(len(DTYPES)) for s in (3, 2.5, *bools) if _valid(op, tensors[i], s)]

    def fn(*xs: torch.Tensor) -> tuple:
        ts, zs = xs[: len(DTYPES)], xs[len(DTYPES) :]
        outs = [op(ts[i], (zs if z else ts)[j]) for i, j, z in valid]
        return (*outs, *(op(ts[i], s) for i, s in scalars))

    check(fn, *tensors, *zero_dim, rtol=1e-2, atol=1e-2)
