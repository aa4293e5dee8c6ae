"""NN lowerings against eager: softmax, norms (with their saved statistics), batch norm in
eval and train (updated running stats), the matmul family, convolution and attention."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import check, fallbacks, lower_fn, ops_of

from vfuse.interp import run
from vfuse.ir import Op

aten = torch.ops.aten


def _x(*shape: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dim: int) -> None:
    x = _x(5, 3, 7).transpose(0, 2) * 10
    graph = check(lambda x: (F.softmax(x, dim), F.log_softmax(x, dim), x.softmax(dim, dtype=torch.float64)), x)
    assert ops_of(graph)[Op.AMAX] == 3  # max-subtracted, so large inputs do not overflow


def test_softmax_half_and_extremes() -> None:
    h = (_x(4, 9) * 5).half()
    x = torch.tensor([[-float("inf"), 0.0, 1.0], [1e4, -1e4, 0.0]])
    check(
        lambda h: (F.softmax(h, -1), F.log_softmax(h, 0), F.softmax(h, 1, dtype=torch.float32)), h, rtol=1e-3, atol=1e-3
    )
    check(lambda x: (F.softmax(x, 1), F.log_softmax(x, 1), F.softmax(torch.zeros(2, 0), 1)), x)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("normalized", [(8,), (3, 8)])
def test_layer_norm_with_mean_and_rstd(affine: bool, normalized: tuple[int, ...]) -> None:
    x = _x(2, 3, 8) * 3 + 1
    params = [_x(*normalized, seed=4), _x(*normalized, seed=5)] if affine else []

    def affine_args(p: tuple) -> tuple:
        return p if affine else (None, None)

    check(lambda x, *p: aten.native_layer_norm(x, list(normalized), *affine_args(p), 1e-5), x, *params, atol=1e-5)
    check(lambda x, *p: F.layer_norm(x, normalized, *affine_args(p), eps=1e-3), x, *params, atol=1e-5)


def test_layer_norm_half() -> None:
    x = (_x(4, 16) * 2).half()
    w, b = _x(16).half(), _x(16, seed=9).half()
    check(lambda x, w, b: aten.native_layer_norm(x, [16], w, b, 1e-5), x, w, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm(weight: bool) -> None:
    x = _x(3, 4, 8)
    params = [_x(8, seed=6)] if weight else []
    check(lambda x, *w: (F.rms_norm(x, (8,), *w), F.rms_norm(x, (4, 8), None, eps=1e-3)), x, *params, atol=1e-5)
    check(lambda x, *w: aten._fused_rms_norm(x, [8], w[0] if w else None, 1e-6), x, *params, atol=1e-5)


def _bn_params(c: int) -> tuple[torch.Tensor, ...]:
    return _x(c, seed=7), _x(c, seed=8), _x(c, seed=9) * 0.1, _x(c, seed=10).abs() + 0.5


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3), (2, 3, 7)])
def test_batch_norm_eval(shape: tuple[int, ...]) -> None:
    x = _x(*shape) * 2 + 1
    p = _bn_params(3)
    check(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3), x, *p, atol=1e-5)
    check(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5), x, *p,
          atol=1e-5)  # fmt: skip
    check(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, None, None, training=False), x, *p, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3)])
def test_batch_norm_train_functional_all_outputs(shape: tuple[int, ...]) -> None:
    x = _x(*shape) * 2 + 1
    p = _bn_params(3)
    fn = aten._native_batch_norm_legit_functional
    check(lambda x, w, b, rm, rv: fn(x, w, b, rm, rv, True, 0.1, 1e-5), x, *p, atol=1e-5)
    check(lambda x, w, b, rm, rv: fn(x, None, b, rm, rv, False, 0.3, 1e-5), x, *p, atol=1e-5)
    check(lambda x, w, b, rm, rv: aten._native_batch_norm_legit.no_stats(x, w, None, True, 0.1, 1e-5), x, *p,
          atol=1e-5)  # fmt: skip
    check(lambda x, w, b, rm, rv: F.batch_norm(x, None, None, w, b, training=True), x, *p, atol=1e-5)


def test_batch_norm_train_updates_running_stats_through_aot() -> None:
    """aot_autograd returns the updated running stats as extra outputs (mutated inputs first)."""
    x = _x(8, 3, 4, 4) * 2 + 1
    w, b, rm, rv = _bn_params(3)
    graph = lower_fn(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2),
                     [x, rm.clone(), rv.clone(), w, b])  # fmt: skip
    assert not fallbacks(graph)
    new_rm, new_rv, y = run(graph, [x, rm.clone(), rv.clone(), w, b])
    want_rm, want_rv = rm.clone(), rv.clone()
    want_y = F.batch_norm(x, want_rm, want_rv, w, b, training=True, momentum=0.2)
    for got, want in ((new_rm, want_rm), (new_rv, want_rv), (y, want_y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


MATMUL: list[tuple[str, Callable, tuple[tuple[int, ...], ...]]] = [
    ("mm", torch.mm, ((3, 4), (4, 5))),
    ("bmm", torch.bmm, ((2, 3, 4), (2, 4, 5))),
    ("matmul_broadcast", torch.matmul, ((2, 1, 3, 4), (5, 4, 6))),
    ("matmul_1d_1d", torch.matmul, ((4,), (4,))),
    ("matmul_1d_nd", torch.matmul, ((4,), (2, 4, 5))),
    ("matmul_nd_1d", torch.matmul, ((2, 3, 4), (4,))),
    ("matmul_2d_1d", torch.matmul, ((3, 4), (4,))),
    ("mv", torch.mv, ((3, 4), (4,))),
    ("dot", torch.dot, ((4,), (4,))),
    ("linear_2d", lambda x, w: F.linear(x, w), ((3, 4), (5, 4))),
    ("linear_3d_bias", lambda x, w: F.linear(x, w, w[:, 0]), ((2, 3, 4), (5, 4))),
    ("addmm", lambda a, b: torch.addmm(b[0], a, b), ((3, 4), (4, 5))),
    ("addmm_scaled", lambda a, b: torch.addmm(b[0], a, b, beta=0.5, alpha=2.0), ((3, 4), (4, 5))),
    ("addmm_beta0_ignores_nan", lambda a, b: torch.addmm(b[0] * float("nan"), a, b, beta=0), ((3, 4), (4, 5))),
    ("baddbmm", lambda a, b: torch.baddbmm(b[:, :1, :], a, b, alpha=0.5), ((2, 3, 4), (2, 4, 5))),
    ("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), ((2, 3, 4), (2, 4, 5))),
    ("transposed_operands", lambda a, b: a.t() @ b.t(), ((4, 3), (5, 4))),
    ("zero_inner_dim", torch.mm, ((3, 0), (0, 5))),
]


@pytest.mark.parametrize(("name", "fn", "shapes"), MATMUL, ids=[m[0] for m in MATMUL])
def test_matmul_family(name: str, fn: Callable, shapes: tuple[tuple[int, ...], ...]) -> None:
    graph = check(fn, *(_x(*s, seed=i) for i, s in enumerate(shapes)), atol=1e-5)
    assert ops_of(graph)[Op.MATMUL] == 1


CONV: list[tuple[str, dict, int]] = [
    ("plain", {}, 1),
    ("stride_pad", {"stride": 2, "padding": 1}, 1),
    ("asym", {"stride": (1, 2), "padding": (2, 0), "dilation": (2, 1)}, 1),
    ("groups", {"groups": 2, "padding": 1}, 2),
    ("depthwise", {"groups": 4, "padding": "same"}, 4),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("name", "kw", "groups"), CONV, ids=[c[0] for c in CONV])
def test_conv2d(name: str, kw: dict, groups: int, bias: bool) -> None:
    x, w = _x(2, 4, 9, 8), _x(6 if groups != 4 else 4, 4 // groups, 3, 3, seed=1)
    b = [_x(w.shape[0], seed=2)] if bias else []
    graph = check(lambda x, w, *b: F.conv2d(x, w, b[0] if b else None, **kw), x, w, *b, atol=1e-5)
    assert ops_of(graph)[Op.CONV2D] == 1 and ops_of(graph)[Op.ADD] == int(bias)


def test_transposed_and_1d_convolution_run_through_torch() -> None:
    x1, w1 = _x(2, 4, 9), _x(3, 4, 3)
    x2, w2 = _x(2, 4, 5, 5), _x(4, 3, 3, 3)
    graph = check(lambda x1, w1, x2, w2: (F.conv1d(x1, w1), F.conv_transpose2d(x2, w2)), x1, w1, x2, w2,
                  allow=("convolution",), atol=1e-5)  # fmt: skip
    assert fallbacks(graph)["aten.convolution.default"] == 2


def _qkv(hq: int = 4, hk: int = 4, lq: int = 6, lk: int = 6) -> tuple[torch.Tensor, ...]:
    return _x(2, hq, lq, 8, seed=11), _x(2, hk, lk, 8, seed=12), _x(2, hk, lk, 8, seed=13)


SDPA: list[tuple[str, Callable, tuple]] = [
    ("plain", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), ()),
    ("causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), ()),
    ("scale", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), ()),
    ("float_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=q[0, 0, :, :6] * 3), ()),
    ("bool_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=(q[0, 0, :, :6] > 0)), ()),
    ("gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), (4, 2)),
    ("cross_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (4, 4, 3, 6)),
    ("transposed_in", lambda q, k, v: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                      v.transpose(1, 2)), ()),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn", "dims"), SDPA, ids=[s[0] for s in SDPA])
def test_sdpa(name: str, fn: Callable, dims: tuple) -> None:
    graph = check(fn, *_qkv(*dims), atol=1e-5)
    assert ops_of(graph)[Op.SDPA] == 1


def test_sdpa_lowers_from_every_aten_spelling() -> None:
    q, k, v = _qkv()
    check(lambda q, k, v: aten.scaled_dot_product_attention(q, k, v, None, 0.0, True), q, k, v, atol=1e-5)
    check(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0], q, k, v, atol=1e-5)


def test_sdpa_with_used_logsumexp_lowers_to_sdpa_lse() -> None:
    """Training saves the CPU kernel's logsumexp for the backward: SDPA_LSE gives both (fp32)."""
    q, k, v = _qkv()
    graph = check(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v), q, k, v, atol=1e-5)
    assert ops_of(graph)[Op.SDPA_LSE] == 1 and ops_of(graph)[Op.SDPA] == 0 and not fallbacks(graph)


def test_sdpa_with_used_logsumexp_in_float64_runs_through_torch() -> None:
    q, k, v = (t.double() for t in _qkv())
    graph = check(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v), q, k, v,
                  allow=("flash_attention",), atol=1e-5)  # fmt: skip
    assert ops_of(graph)[Op.SDPA_LSE] == 0 and ops_of(graph)[Op.GET_ITEM] == 2


def test_sdpa_math_path_lowers_without_fallback() -> None:
    """A 3-D bool mask makes torch pick its math attention (with _safe_softmax): still all lowered."""
    q, k, v = _qkv()
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=q[0, :, :, :6] > 0), q, k, v, atol=1e-5)


def test_safe_softmax_rows_of_minus_inf_give_zeros() -> None:
    x = torch.tensor([[-float("inf")] * 3, [1.0, -float("inf"), 0.0]])
    check(lambda x: aten._safe_softmax(x, 1), x)


def test_attention_dropout() -> None:
    """On CPU torch picks its math path for attention dropout, which lowers to a RAND node."""
    q, k, v = _qkv()
    graph = lower_fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5), [q, k, v])
    assert not fallbacks(graph) and ops_of(graph)[Op.RAND] == 1


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "padding", "dilation", "ceil"),
    [
        ((2, 5, 13, 11), 3, 2, 1, 1, False),  # ResNet's stem pool, odd sizes
        ((1, 3, 7, 9), 3, 2, 1, 1, True),  # ceil_mode: the last window runs past the padding
        ((2, 3, 9, 6), (2, 3), None, 0, 1, False),  # stride defaults to the kernel
        ((1, 2, 10, 10), 3, 1, 1, 2, False),  # dilated
        ((3, 8, 7), 3, 2, 1, 1, True),  # unbatched
        ((1, 1, 5, 5), 5, 1, 2, 1, False),  # a window over the whole input
    ],
)
def test_max_pool2d_is_native_and_exact(
    shape: tuple[int, ...], kernel: object, stride: object, padding: int, dilation: int, ceil: bool
) -> None:
    x = _x(*shape)
    x.view(-1)[3], x.view(-1)[7], x.view(-1)[11] = float("nan"), -float("inf"), -0.0

    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil)  # type: ignore[arg-type]

    graph = check(pool, x, rtol=0, atol=0)  # NaN propagates, as in eager; max is exact
    assert ops_of(graph)[Op.MAXIMUM] >= 1


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "padding", "dilation", "ceil"),
    [((2, 3, 13, 11), 3, 2, 1, 1, False), ((1, 2, 7, 9), 3, 2, 1, 1, True), ((1, 2, 10, 10), 3, 1, 1, 2, False)],
)
def test_max_pool2d_indices_are_native_and_exact(
    shape: tuple[int, ...], kernel: int, stride: int, padding: int, dilation: int, ceil: bool
) -> None:
    """The indices eager's CPU kernel picks: the first of tied values, the last NaN, a window
    of -inf keeps its first tap inside the input (never a padding position)."""
    x = _x(*shape).round()  # rounded: many ties
    x.view(-1)[3], x.view(-1)[7], x.view(-1)[11] = float("nan"), -float("inf"), -0.0
    x[..., :3, :3] = -float("inf")

    def pool(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil, return_indices=True)

    graph = check(pool, x, rtol=0, atol=0)
    assert not fallbacks(graph)


def test_max_pool2d_indices_of_larger_inputs_are_native() -> None:
    # 25600 windows x 4 taps went to torch under the old CPU gate; the kernel is the faster one
    # (quiet Zen 4, 2 threads: 27 vs eager's 119 us; docs/perf-log.md)
    x = _x(4, 16, 40, 40)
    graph = check(lambda x: F.max_pool2d(x, 2, return_indices=True), x)
    assert not fallbacks(graph)
