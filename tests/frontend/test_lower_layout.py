"""Layout lowerings against eager: views, permutes, expand, slices (clamped, stepped),
select, squeeze/unsqueeze, cat, split/unbind, flatten, copies, factories, arange, triu/tril."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tests.frontend.lowering_helpers import check, ops_of

from vfuse.ir import Op


def _x() -> torch.Tensor:
    return torch.randn(6, 4, 5).transpose(0, 1)  # (4, 6, 5), non-contiguous


LAYOUT: list[tuple[str, Callable]] = [
    ("view", lambda x: (x.reshape(24, 5), x.reshape(-1), x.reshape(2, 2, 6, 5), x.view(4, 6, 5))),
    ("permute", lambda x: (x.permute(2, 0, 1), x.permute(-1, -2, -3), x.permute(0, 1, 2) + 1)),
    ("transpose", lambda x: (x.transpose(0, 2), x.transpose(-1, 1), x[0].t(), x[0, 0].t(), x.mT)),
    ("expand", lambda x: (x[:, :1].expand(4, 6, 5), x[0:1].expand(3, 4, 6, 5), x[:, :, :1].expand(-1, -1, 7))),
    ("slice", lambda x: (x[1:3], x[:, ::2], x[..., 1:-1], x[:, -100:100], x[:, 4:2], x[::3, 1::4, 2:])),
    ("select", lambda x: (x[0], x[:, -1], x[..., 2], x[1, 2, 3])),
    ("squeeze", lambda x: (x[:, :1].squeeze(), x[:, :1].squeeze(1), x[:1, :1].squeeze((0, 1)), x.unsqueeze(1),
                           x.unsqueeze(-1), x[0, 0, 0].unsqueeze(0))),
    ("flatten", lambda x: (x.flatten(), x.flatten(1), x.flatten(0, 1), x.unflatten(1, (2, 3)))),
    ("cat", lambda x: (torch.cat([x, x * 2], 0), torch.cat([x, x[:, :2]], 1), torch.cat([x[..., :1], x], -1))),
    ("cat_promotes", lambda x: (torch.cat([x, x.int()], 0), torch.cat([x.half(), x.double()], 2))),
    ("stack", lambda x: (torch.stack([x, x + 1]), torch.stack([x, -x], dim=-1))),
    ("split", lambda x: (*torch.split(x, 2, 1), *torch.split(x, [1, 3, 2], dim=1), *x.chunk(3, -1))),
    ("unbind", lambda x: (*x.unbind(0), *x[..., :2].unbind(-1))),
    ("narrow", lambda x: (x.narrow(1, 2, 3), x.narrow(-1, -3, 2))),
    ("copies", lambda x: (x.clone(), x.contiguous() * 1, x.detach() + 0, x.clone().mul(2))),
    ("repeat", lambda x: (x.repeat(2, 1, 1), x[0].repeat(1, 2))),
    ("movedim", lambda x: (x.movedim(0, -1), x.swapaxes(0, 1))),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn"), LAYOUT, ids=[t[0] for t in LAYOUT])
def test_layout(name: str, fn: Callable) -> None:
    check(fn, _x())


def test_layout_of_zero_size_and_size_one_dims() -> None:
    e, one = torch.randn(0, 3), torch.randn(1, 3, 1)
    check(
        lambda e, one: (e.t(), e.reshape(3, 0), torch.cat([e, e], 0), e[:, 1:], one.squeeze(), one.expand(4, 3, 2),
                        one.permute(2, 1, 0), torch.cat([e, one[0].t()], 0), *torch.split(e, 1, 1)),
        e, one,
    )  # fmt: skip


def test_legacy_empty_tensor_in_cat_is_skipped() -> None:
    x = torch.randn(2, 3)
    check(lambda x: torch.cat([x, torch.zeros(0), x], 0), x)


def test_identity_views_emit_nothing() -> None:
    ops = ops_of(check(lambda x: x.reshape(2, 3).permute(0, 1).contiguous().clone()[:, :] * 2, torch.randn(2, 3)))
    assert ops[Op.RESHAPE] == ops[Op.PERMUTE] == ops[Op.SLICE] == 0


def test_select_is_slice_then_reshape() -> None:
    ops = ops_of(check(lambda x: x[:, 1], torch.randn(3, 4)))
    assert ops[Op.SLICE] == 1 and ops[Op.RESHAPE] == 1


FACTORIES: list[tuple[str, Callable]] = [
    ("full", lambda x: (torch.full((2, 3), 1.5), torch.full((2,), 7), torch.full((), True), x + torch.full((5,), 2.0))),
    ("zeros_ones", lambda x: (torch.zeros(3, 2), torch.ones(4, dtype=torch.int32), x + torch.zeros_like(x),
                              torch.ones_like(x, dtype=torch.int64), torch.full_like(x, -3.0))),
    ("new", lambda x: (x.new_zeros(2, 3), x.new_ones(3), x.new_full((2,), 4.0), torch.empty_like(x).fill_(2.0),
                       x.new_empty(3).zero_())),
    ("scalar_tensor", lambda x: (x * torch.scalar_tensor(3.0), x + torch.tensor(2.0))),
    ("arange", lambda x: (torch.arange(5), torch.arange(2, 11, 3), torch.arange(0.5, 3.0, 0.25),
                          torch.arange(-4, 4, dtype=torch.float32), x + torch.arange(5))),
    ("triu_tril", lambda x: (x.triu(), x.tril(), x.triu(2), x.tril(-1), x[0].triu(-2), x[0].tril(10))),
    ("fill", lambda x: (x.clone().fill_(3.0), x.clone().fill_(x[0, 0, 0]), x.clone().zero_())),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn"), FACTORIES, ids=[t[0] for t in FACTORIES])
def test_factories(name: str, fn: Callable) -> None:
    check(fn, _x())


def test_arange_is_iota() -> None:
    assert ops_of(check(lambda x: x + torch.arange(3), torch.randn(2, 3)))[Op.IOTA] == 1


def test_tril_on_bool_and_int() -> None:
    m, i = torch.rand(4, 5) > 0.5, torch.randint(0, 9, (2, 4, 5))
    check(lambda m, i: (m.tril(), i.triu(1)), m, i)


def test_index_select_and_leading_integer_index() -> None:
    x = torch.randn(4, 5, 6).transpose(0, 1)
    i, j = torch.tensor([3, 0, 0, 2]), torch.tensor([[1, 4], [0, 0]], dtype=torch.int32)
    graph = check(lambda x, i, j: (x.index_select(0, i), x.index_select(1, i[:2]), x.index_select(-1, i), x[i], x[j],
                                   x[0][j.long() % 4]), x, i, j)  # fmt: skip
    assert ops_of(graph)[Op.EMBEDDING] == 6


def test_embedding() -> None:
    table = torch.randn(10, 4)
    idx = torch.tensor([[1, 0, 9], [3, 3, 2]])
    check(lambda t, i: (torch.nn.functional.embedding(i, t), torch.nn.functional.embedding(i.int(), t)), table, idx)
    check(lambda t, i: torch.nn.functional.embedding(i, t, padding_idx=0) * 2, table, idx)


@pytest.mark.parametrize(
    ("shape", "dim", "index_shape"),
    [
        ((2, 9), 1, (2, 9)),
        ((5, 7, 3), 1, (4, 11, 2)),
        ((5, 7, 3), 0, (9, 7, 3)),
        ((5, 7, 3), -1, (5, 2, 6)),
        ((13,), 0, (1,)),
    ],
)
def test_gather(shape: tuple[int, ...], dim: int, index_shape: tuple[int, ...]) -> None:
    # HF BERT gathers its token_type_ids buffer at the position ids; odd and smaller index shapes.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).transpose(0, -1).contiguous().transpose(0, -1)  # a view
    index = torch.randint(0, shape[dim], index_shape, generator=gen)
    graph = check(lambda x, i: torch.gather(x, dim, i) * 2, x, index)
    assert ops_of(graph)[Op.EMBEDDING] == 2


def test_gather_index_out_of_its_dim_raises() -> None:
    import vfuse

    x, index = torch.randn(3, 4), torch.tensor([[0, 4]])  # 4: past dim 1 but inside the buffer
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, i: torch.gather(x, 1, i), backend=vfuse.backend(strict=True))
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 4"):
        compiled(x, index)
    with pytest.raises(IndexError):
        compiled(x, -index)
