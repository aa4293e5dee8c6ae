"""Contraction groups run as one generated kernel (GEMM / conv / flash attention + epilogue).

Each model is compiled through torch.compile with the vfuse backend (frozen, inference),
matched against eager, and the executor must have run its contraction as a generated
`ContractionKernel`, with no torch step at all.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vfuse
from vfuse.ir import Op
from vfuse.schedule import TorchStep
from vfuse.schedule.kernel import ContractionKernel


def _compiled(model: nn.Module, *xs: torch.Tensor) -> tuple[torch.Tensor, list[ContractionKernel], list]:
    """(vfuse's result, the contraction kernels of every compiled graph, the executors)."""
    torch._dynamo.reset()  # a recompiled Sequential.forward would lift parameters unfrozen
    backend = vfuse.backend(strict=True, freeze=True)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(*xs)
        ref = model(*xs)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    executors = [c.executor for c in backend.compiled]
    kernels = [k for ex in executors for k in ex.program.kernels if isinstance(k, ContractionKernel)]
    return got, kernels, executors


def _check(model: nn.Module, *xs: torch.Tensor, ops: tuple[Op, ...], fused: bool = True) -> list[ContractionKernel]:
    """Numerics vs eager; every contraction generated (one kernel per `ops` entry), no torch step."""
    _, kernels, executors = _compiled(model.eval(), *xs)
    assert sorted(k.op.value for k in kernels) == sorted(o.value for o in ops)
    for ex in executors:
        assert ex.stats.torch_calls == 0 and not ex.stats.fallbacks
        assert not any(isinstance(s, TorchStep) for s in ex.program.steps)
    if fused:  # the epilogue ran inside the contraction: its kernel stores the group's output
        assert all(k.epilogue for k in kernels)
    return kernels


class _Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor], **mods: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleDict(mods)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(self.mods, *xs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_linear_bias_gelu(approximate: str) -> None:
    torch.manual_seed(0)
    (k,) = _check(nn.Sequential(nn.Linear(40, 72), nn.GELU(approximate)), torch.randn(33, 40), ops=(Op.MATMUL,))
    assert k.trans_b and len(k.extras) == 1  # the weight read in place, the bias in the epilogue


def test_linear_relu_3d_input() -> None:
    torch.manual_seed(1)
    (k,) = _check(nn.Sequential(nn.Linear(24, 48), nn.ReLU()), torch.randn(3, 5, 24), ops=(Op.MATMUL,))
    assert k.space == (3, 5, 48) and k.out_shape == (15, 48)


def test_linear_plus_residual() -> None:
    torch.manual_seed(2)
    m = _Fn(lambda m, x: m["lin"](x) + x, lin=nn.Linear(32, 32))
    (k,) = _check(m, torch.randn(20, 32), ops=(Op.MATMUL,))
    assert len(k.extras) == 2  # bias and residual


@pytest.mark.parametrize("case", ["vector_unsqueezed", "dims_split", "rows_split"])
def test_transposed_rhs_read_as_the_shape_the_transpose_saw(case: str) -> None:
    # B = t(reshape(buffer)): the buffer is read in place at the reshaped shape, not its own (a
    # 1-D buffer has no last two dims: an outer product in a training graph's weight gradient
    # failed code generation, found by the fuzzer; a (2, 32, 4) buffer gave wrong numbers).
    torch.manual_seed(5)
    if case == "vector_unsqueezed":
        m = _Fn(lambda m, x, v: torch.tanh(x @ v.unsqueeze(1).t()))
        xs = (torch.randn(9, 1), torch.randn(64))
    elif case == "dims_split":
        m = _Fn(lambda m, x, w: torch.tanh(x @ w.reshape(64, 20).t()))
        xs = (torch.randn(33, 20), torch.randn(64, 4, 5))
    else:  # the buffer's last dim is K: read as a batch of 2 (32, 4) matrices, a silent wrong result
        m = _Fn(lambda m, x, w: torch.tanh(x @ w.reshape(64, 4).t()))
        xs = (torch.randn(33, 4), torch.randn(2, 32, 4))
    (k,) = _check(m, *xs, ops=(Op.MATMUL,))
    assert k.trans_b


def test_bmm_with_epilogue_and_transposed_rhs() -> None:
    torch.manual_seed(3)
    m = _Fn(lambda m, a, b: torch.sigmoid(torch.bmm(a, b.transpose(1, 2)) * 0.5))
    _check(m, torch.randn(3, 17, 24), torch.randn(3, 19, 24), ops=(Op.MATMUL,))


def test_matmul_with_permuted_lhs_packs_it_in_place_of_a_copy() -> None:
    torch.manual_seed(4)
    m = _Fn(lambda m, a, b: torch.tanh(a.t() @ b))
    _, kernels, executors = _compiled(m, torch.randn(24, 16), torch.randn(24, 8))
    assert [k.op for k in kernels] == [Op.MATMUL]
    (ex,) = executors
    assert ex.stats.torch_calls == 0 and ex.stats.kernels == 1  # a.t() is read by the A packer
    (pro, _) = kernels[0].prologues
    assert pro is not None and pro.inner == -2  # contiguous along A's rows: walked innermost


def test_conv_bn_relu_folded() -> None:
    torch.manual_seed(5)
    bn = nn.BatchNorm2d(8)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), bn, nn.ReLU())
    (k,) = _check(m, torch.randn(2, 4, 10, 9), ops=(Op.CONV2D,))
    assert len(k.extras) == 1  # BN folded into the weight, one per-channel shift


def test_conv_plus_residual() -> None:
    torch.manual_seed(6)
    m = _Fn(lambda m, x: F.relu(m["conv"](x) + x), conv=nn.Conv2d(6, 6, 3, padding=1, bias=False))
    _check(m, torch.randn(2, 6, 8, 8), ops=(Op.CONV2D,))


def test_grouped_strided_conv() -> None:
    torch.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(8, 12, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2), groups=4), nn.SiLU())
    _check(m, torch.randn(2, 8, 11, 12), ops=(Op.CONV2D,))


def _sdpa(m: nn.ModuleDict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, **kw) * 3.0


def test_sdpa_causal_with_epilogue() -> None:
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 3, 20, 16) for _ in range(3))
    (kern,) = _check(_Fn(lambda m, q, k, v: _sdpa(m, q, k, v, is_causal=True)), q, k, v, ops=(Op.SDPA,))
    assert kern.attrs["causal"]


def test_sdpa_additive_mask() -> None:
    torch.manual_seed(9)
    q, k, v = torch.randn(2, 2, 12, 8), torch.randn(2, 2, 18, 8), torch.randn(2, 2, 18, 8)
    mask = torch.randn(2, 1, 12, 18)
    (kern,) = _check(_Fn(lambda m, q, k, v, a: _sdpa(m, q, k, v, attn_mask=a)), q, k, v, mask, ops=(Op.SDPA,))
    assert len(kern.operands) == 4


def test_sdpa_gqa_bool_mask() -> None:
    torch.manual_seed(10)
    q, k, v = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    keep = torch.rand(10, 10) > 0.3
    keep[:, 0] = True  # no fully masked row (eager gives NaN there, SDPA 0)
    fn = _Fn(lambda m, q, k, v, a: _sdpa(m, q, k, v, attn_mask=a, enable_gqa=True))
    _check(fn, q, k, v, keep, ops=(Op.SDPA,))


def test_attention_block_with_projections() -> None:
    """Permuted q/k/v are copied out first; the projections and output stay generated GEMMs."""
    torch.manual_seed(11)

    def block(m: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = m["qkv"](x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 16)
        return m["out"](y) + x

    fn = _Fn(block, qkv=nn.Linear(16, 48), out=nn.Linear(16, 16))
    _check(fn, torch.randn(2, 9, 16), ops=(Op.MATMUL, Op.SDPA, Op.MATMUL), fused=False)


def test_linear_with_two_outputs_stores_the_product_then_runs_the_epilogue() -> None:
    torch.manual_seed(12)
    m = _Fn(lambda m, x: (m["lin"](x), F.gelu(m["lin"](x)) * x.sum(dim=1, keepdim=True)), lin=nn.Linear(24, 24))
    _, kernels, executors = _compiled(m, torch.randn(10, 24))
    assert [k.op for k in kernels] == [Op.MATMUL]
    assert all(ex.stats.torch_calls == 0 for ex in executors)


def test_two_attention_kernels_share_one_translation_unit_at_any_thread_count() -> None:
    torch.manual_seed(13)

    def two(m: nn.ModuleDict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(a, k, v) - 1.0

    model, xs = _Fn(two), [torch.randn(1, 2, 40, 16) for _ in range(3)]
    kernels = _check(model, *xs, ops=(Op.SDPA, Op.SDPA), fused=False)
    assert len({k.name for k in kernels}) == 2
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):  # the kernels take their thread count from torch's, like every kernel
            torch.set_num_threads(n)
            _compiled(model, *xs)
    finally:
        torch.set_num_threads(threads)


def test_prologue_value_read_by_the_epilogue_and_returned() -> None:
    torch.manual_seed(14)
    m = _Fn(lambda m, a, b: (torch.relu(a @ b.t()) + b.t()[:1], b.t() * 2.0))
    _, kernels, executors = _compiled(m, torch.randn(6, 8), torch.randn(8, 8))
    assert [k.op for k in kernels] == [Op.MATMUL]
    assert all(ex.stats.torch_calls == 0 for ex in executors)
