"""Backward ops lowered to IR instead of torch fallbacks: nll_loss's forward and backward
(cross-entropy's second half), pooling (max with its indices, average over any windows) and
embedding backward, checked against eager's outputs and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.errors import VfuseIndexError
from vfuse.frontend import lower_pool

CASES = [
    # (logits shape, target, reduction, ignore_index)
    ((5, 7), [1, 0, 6, 3, 3], "mean", -100),
    ((5, 7), [1, -100, 6, 3, -100], "mean", -100),  # ignored rows do not count in the mean
    ((5, 7), [1, 2, 6, 3, 2], "sum", 2),
    ((4, 1009), [1008, 0, 17, 5], "none", -100),
    ((11,), 4, "mean", -100),  # one sample, no batch dim
]


@pytest.mark.parametrize(
    ("shape", "target", "reduction", "ignore", "dtype"),
    [(*c, torch.float64) for c in CASES] + [(*CASES[1], torch.float32)],
)
def test_cross_entropy_forward_and_backward_without_fallback(shape, target, reduction, ignore, dtype) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    t = torch.tensor(target)
    weight = torch.randn(shape[0] if reduction == "none" else (), dtype=dtype)  # a non-trivial grad_output

    def loss(x: torch.Tensor) -> torch.Tensor:
        return (F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore) * weight).sum()

    backend = vfuse.backend(strict=True)
    got = torch.compile(loss, backend=backend)(x)
    (grad,) = torch.autograd.grad(got, x)
    want = loss(x)
    (want_grad,) = torch.autograd.grad(want, x)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(grad, want_grad, **tol)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats


def test_class_weights_still_run_through_torch() -> None:
    torch._dynamo.reset()
    x = torch.randn(3, 4, requires_grad=True)
    w, t = torch.rand(4), torch.tensor([0, 3, 1])
    backend = vfuse.backend()
    got = torch.compile(lambda x: F.cross_entropy(x, t, weight=w), backend=backend)(x)
    torch.testing.assert_close(got, F.cross_entropy(x, t, weight=w))
    assert backend.stats["fallbacks"]["aten.nll_loss_forward.default"] == 1


@pytest.mark.parametrize(
    ("shape", "k", "dtype"),
    [((2, 3, 8, 6), 2, torch.float32), ((1, 2, 9, 9), 3, torch.float64), ((3, 4, 10), 2, torch.float32)],
)
def test_avg_pool2d_tiling_windows_forward_and_backward(shape, k, dtype) -> None:
    """Windows that tile the input (kernel == stride, no padding): a two-axis row sum forward,
    eager's grad / (k*k) spread over each window backward (bit for bit)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    g = torch.randn(F.avg_pool2d(x, k).shape, dtype=dtype)
    backend = vfuse.backend(strict=True)
    got = torch.compile(lambda x: F.avg_pool2d(x, k), backend=backend)(x)
    (grad,) = torch.autograd.grad(got, x, g)
    want = F.avg_pool2d(x, k)
    (want_grad,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(got, want)  # the window's sum in another order: an ulp or so
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


@pytest.fixture
def no_cpu_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower every pool and embedding backward natively, whatever the CPU cost gate says."""
    for form in lower_pool.Form:
        monkeypatch.setitem(lower_pool.CPU_TERMS, form, None)


def _grads(fn, x: torch.Tensor, backend) -> tuple:
    got = torch.compile(fn, backend=backend)(x)
    g = torch.randn(got.shape, dtype=got.dtype)
    (grad,) = torch.autograd.grad(got, x, g)
    want = fn(x)
    (want_grad,) = torch.autograd.grad(want, x, g)
    return got, want, grad, want_grad


POOLS = [
    # (shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 13, 11), 3, 2, 1, 1, False),  # ResNet's stem pool, odd sizes: windows overlap
    ((1, 2, 7, 9), 3, 2, 1, 1, True),  # ceil_mode: the last window runs past the padding
    ((2, 3, 9, 6), (2, 3), None, 0, 1, False),  # stride defaults to the kernel, uneven
    ((1, 2, 10, 11), 3, 1, 1, 2, False),  # dilated (max only)
    ((3, 7, 5), 3, 2, 1, 1, True),  # unbatched
    ((1, 1, 5, 5), 5, 1, 2, 1, False),  # a window over the whole input
    ((1, 1, 1, 1), 1, 1, 0, 1, False),
    ((2, 2, 7, 7), 2, 3, 1, 1, True),  # stride > kernel: some inputs in no window
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation", "ceil"), POOLS)
@pytest.mark.usefixtures("no_cpu_limits")
def test_max_pool2d_backward_is_native_and_exact(shape, kernel, stride, padding, dilation, ceil) -> None:
    """Each gradient goes where the saved index points (ties: the first tap, as eager's forward),
    added in eager's order: bit for bit."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape).round().requires_grad_()  # rounded: many ties

    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil)

    backend = vfuse.backend(strict=True)
    got, want, grad, want_grad = _grads(pool, x, backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


# count_include_pad=False where windows reach into the padding (ceil_mode, wide padding)
AVG_POOLS = [(*p, p[0] not in ((1, 2, 7, 9), (3, 7, 5), (1, 1, 5, 5))) for p in POOLS if p[4] == 1]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation", "ceil", "include_pad"), AVG_POOLS)
@pytest.mark.usefixtures("no_cpu_limits")
def test_avg_pool2d_backward_is_native_and_exact(shape, kernel, stride, padding, dilation, ceil, include_pad) -> None:
    """Any windows (overlapping, padded, ceil_mode): each window's gradient divided once by eager's
    divisor, then added in eager's order: bit for bit, forward too."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64 if ceil else torch.float32, requires_grad=True)

    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil, count_include_pad=include_pad)

    backend = vfuse.backend(strict=True)
    got, want, grad, want_grad = _grads(pool, x, backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


@pytest.mark.usefixtures("no_cpu_limits")
def test_avg_pool2d_divisor_override() -> None:
    torch._dynamo.reset()
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    backend = vfuse.backend(strict=True)
    got, want, grad, want_grad = _grads(lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5), x, backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


def test_pool_backward_of_larger_inputs_is_native() -> None:
    """No cost gate for the backwards on CPU: max and average pooling's are SCATTER_ADDs (eager's
    walk, ir/defs/scatter.py) at any size. Gradients match."""
    torch._dynamo.reset()
    x = torch.randn(2, 16, 20, 20, requires_grad=True)
    backend = vfuse.backend()
    got, want, grad, want_grad = _grads(lambda x: F.max_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1), x, backend)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, want_grad)
    assert not {k: v for k, v in backend.stats["fallbacks"].items() if "backward" in k}, backend.stats


def test_max_pool2d_with_indices_of_a_large_input_is_native() -> None:
    """No CPU gate on the forward with indices either: past 65536 window terms (where it used to go
    to torch) the kernel gives eager's values and indices (ties: the first tap)."""
    x = torch.randn(2, 8, 57, 61).round()  # 2*8*29*31*9 = 129456 terms; rounded: ties
    fn = lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)  # noqa: E731
    compiled = vfuse.compile(fn, (x,), strict=True)
    (got, got_i), (want, want_i) = compiled(x), fn(x)
    assert torch.equal(got, want) and torch.equal(got_i, want_i)
    assert compiled.stats.torch_calls == 0


def test_max_pool2d_backward_indices_out_of_range_raise(no_cpu_limits: None) -> None:
    aten = torch.ops.aten
    x = torch.randn(2, 3, 7, 7)
    y, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    g = torch.randn_like(y)

    def backward(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    compiled = vfuse.compile(backward, (g, x, idx))
    torch.testing.assert_close(compiled(g, x, idx), backward(g, x, idx), rtol=0, atol=0)
    for bad in (49, -1):
        wrong = idx.clone()
        wrong[1, 2, 3, 1] = bad
        with pytest.raises(VfuseIndexError, match=f"index {bad} is out of bounds"):
            compiled(g, x, wrong)


EMBEDDINGS = [
    # (rows, index shape, width, padding_idx, repeated)
    (37, (2, 13), 16, None, True),
    (11, (5,), 3, 2, True),  # padding_idx: that row gets no gradient
    (7, (0,), 4, None, False),  # no indices: a zero gradient
    (1, (3,), 5, None, True),  # one row
    (13, (1, 1), 1, 12, False),
]


@pytest.mark.parametrize(("rows", "ishape", "width", "padding_idx", "repeated"), EMBEDDINGS)
def test_embedding_backward_is_native(rows, ishape, width, padding_idx, repeated) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(rows, width, requires_grad=True)
    idx = torch.randint(0, min(rows, 3) if repeated else rows, ishape)
    if padding_idx is not None and idx.numel():
        idx.view(-1)[0] = padding_idx

    def embed(w: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, w, padding_idx=padding_idx) * 3

    backend = vfuse.backend(strict=True)
    got, want, grad, want_grad = _grads(embed, w, backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)
    if padding_idx is not None:
        assert not grad[padding_idx].any()
    assert not backend.stats["fallbacks"], backend.stats


def test_embedding_backward_indices_out_of_range_raise() -> None:
    aten = torch.ops.aten
    g, idx = torch.randn(2, 3, 4), torch.tensor([[0, 5, 2], [5, 1, 0]])

    def backward(g: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.embedding_dense_backward(g, idx, 6, -1, False)

    compiled = vfuse.compile(backward, (g, idx))
    torch.testing.assert_close(compiled(g, idx), backward(g, idx))
    for bad in (6, -1):
        with pytest.raises(VfuseIndexError, match=f"index {bad} is out of bounds"):
            compiled(g, torch.tensor([[0, bad, 2], [5, 1, 0]]))


def test_embedding_backward_of_a_large_table_is_native() -> None:
    """No cost gate on CPU: the SCATTER_ADD does eager's work (the one-hot form was gated)."""
    torch._dynamo.reset()
    w = torch.randn(1000, 64, requires_grad=True)
    idx = torch.randint(0, 1000, (4, 64))
    backend = vfuse.backend(strict=True)
    _, _, grad, want_grad = _grads(lambda w: F.embedding(idx, w), w, backend)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert not backend.stats["fallbacks"], backend.stats


class PoolCNN(torch.nn.Module):
    """Conv, ReLU, max pool (ResNet's stem), conv, overlapping average pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 6, 3, padding=1)
        self.head = torch.nn.Linear(6 * 3 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 3, stride=2, padding=1)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 3, stride=2, padding=1, count_include_pad=False)
        return self.head(x.flatten(1))


class TinyLM(torch.nn.Module):
    """Token embedding (with a padding token), linear, tied-free output head."""

    def __init__(self, vocab: int = 29, width: int = 12) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width, padding_idx=0)
        self.mix = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens))))


def _train_step_grads(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, backend) -> dict:
    step = torch.compile(model, backend=backend) if backend is not None else model
    model.zero_grad()
    logits = step(x)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("model_name", ["cnn", "lm"])
@pytest.mark.usefixtures("no_cpu_limits")
def test_models_train_one_step_without_backward_fallbacks(model_name: str) -> None:
    """A small CNN with max and average pooling and an embedding LM: one training step's
    gradients match eager within 1e-4 relative, with no pooling, embedding or loss op in torch."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    if model_name == "cnn":
        model: torch.nn.Module = PoolCNN()
        x, target = torch.randn(2, 3, 11, 11), torch.tensor([1, 4])
    else:
        model = TinyLM()
        x = torch.randint(0, 29, (3, 7))
        x[0, 2] = x[1, 2] = 0  # padding tokens, and repeated tokens in the rest
        target = torch.randint(0, 29, (3, 7))
    backend = vfuse.backend(strict=True)
    got = _train_step_grads(model, x, target, backend)
    want = _train_step_grads(model, x, target, None)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=f"gradient of {name}")
    watched = ("pool", "embedding", "nll_loss")
    assert not [k for k in backend.stats["fallbacks"] if any(w in k for w in watched)], backend.stats


def test_max_pool2d_backward_on_a_gpu_target_is_native() -> None:
    """GPU targets have no cost gate: the Triton kernels (Triton's interpreter on CPU tensors)
    give eager's gradient bit for bit and raise for an index outside the input."""
    pytest.importorskip("triton")
    aten = torch.ops.aten
    x = torch.randn(2, 3, 9, 7).round()
    y, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    g = torch.randn_like(y)

    def backward(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    compiled = vfuse.compile(backward, (g, x, idx), backend="triton", target="h100", strict=True)
    torch.testing.assert_close(compiled(g, x, idx), backward(g, x, idx), rtol=0, atol=0)
    assert compiled.stats.torch_calls == 0 and not compiled.stats.fallbacks
    wrong = idx.clone()
    wrong[0, 1, 2, 2] = 63
    with pytest.raises(VfuseIndexError, match="index 63 is out of bounds"):
        compiled(g, x, wrong)


def test_half_pool_sums_run_through_torch() -> None:
    """bf16 window sums: eager accumulates them in fp32, which the summed forms do not reproduce."""
    torch._dynamo.reset()
    x = torch.randn(1, 2, 9, 9, dtype=torch.bfloat16)
    backend = vfuse.backend()
    got = torch.compile(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), backend=backend)(x)
    torch.testing.assert_close(got, F.avg_pool2d(x, 3, stride=2, padding=1), rtol=0, atol=0)
    assert backend.stats["fallbacks"]["aten.avg_pool2d.default"] == 1


def test_group_norm_backward_is_decomposed_and_matches_eager() -> None:
    """native_group_norm_backward runs as IR (it was a torch step); with weight=None and a bias,
    eager torch 2.13's own backward raises "tensor does not have a device" (found by the dynamic
    fuzzer), the compiled one runs."""
    torch.manual_seed(0)
    for shape, groups in (((2, 6, 5, 7), 3), ((1, 4, 7, 9), 4)):
        x, w, b = torch.randn(*shape, requires_grad=True), torch.randn(shape[1]), torch.randn(shape[1])
        w.requires_grad_(True)
        b.requires_grad_(True)

        def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: int = groups) -> torch.Tensor:
            return torch.relu(torch.nn.functional.group_norm(x * 2, g, w, b))

        backend = vfuse.backend()
        torch.compile(f, backend=backend)(x, w, b).sum().backward()
        got = [t.grad.clone() for t in (x, w, b)]
        for t in (x, w, b):
            t.grad = None
        f(x, w, b).sum().backward()
        for a, t in zip(got, (x, w, b), strict=True):
            torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-5)
        assert "aten.native_group_norm_backward.default" not in backend.stats["fallbacks"]
        x.grad = None
        torch.compile(
            lambda x, b, g=groups: torch.nn.functional.group_norm(x, g, None, b).square(), backend=vfuse.backend()
        )(x, b).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
