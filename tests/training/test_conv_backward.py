"""convolution_backward lowered to forward CONV2Ds and layout ops (frontend/lower_conv_backward.py):
gradients of input, weight and bias against eager over strides, paddings, dilations, groups,
kernel shapes and sizes the stride does not divide; only the masked gradients; no torch
convolution_backward left in the compiled backward."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

import vfuse
from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Op
from vfuse.report.rows import RunKind

aten = torch.ops.aten

# (N, C, H, W, Cout, kernel, stride, padding, dilation, groups)
CASES = [
    (1, 3, 7, 9, 5, 3, 1, 1, 1, 1),
    (2, 4, 8, 9, 6, 3, 2, 1, 1, 2),  # (8 + 2 - 3) % 2 = 1: a row the forward drops
    (1, 5, 9, 7, 5, 5, 3, 2, 1, 5),  # depthwise, stride 3: (9 + 4 - 5) % 3 = 2
    (2, 3, 8, 7, 4, 1, 2, 0, 1, 1),  # 1x1 stride 2
    (1, 4, 9, 8, 4, 3, 1, 2, 2, 2),  # dilated, grouped
    (1, 3, 7, 9, 5, (2, 3), (2, 1), (1, 0), 1, 1),  # non-square everything
    (2, 3, 6, 7, 2, 3, 3, 0, 2, 1),  # stride 3, dilation 2: (6 - 5) % 3 = 1, (7 - 5) % 3 = 2
    (1, 3, 5, 6, 4, 1, 1, 1, 1, 1),  # padding past a 1x1 kernel's reach
    (1, 3, 7, 9, 4, 5, 1, 2, 1, 1),  # 5x5
    (1, 2, 7, 9, 3, 3, 2, 2, (2, 1), 1),  # stride 2, padding 2, dilation (2, 1)
    (1, 2, 5, 5, 2, 1, 3, 1, 1, 1),  # 1x1 stride 3: two of three phases get no gradient
]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    # 1e-4 relative to the gradient's scale: elements near 0 are sums that cancel
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_conv_gradients_match_eager_without_fallback() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    params = []
    for n, c, h, w, co, k, s, p, d, g in CASES:
        kh, kw = (k, k) if isinstance(k, int) else k
        x = torch.randn(n, c, h, w, requires_grad=True)
        wt = torch.randn(co, c // g, kh, kw, requires_grad=True)
        b = torch.randn(co, requires_grad=True)
        params.append((x, wt, b, dict(stride=s, padding=p, dilation=d, groups=g)))

    def convs(*flat: torch.Tensor) -> list[torch.Tensor]:
        return [F.conv2d(flat[3 * i], flat[3 * i + 1], flat[3 * i + 2], **kw) for i, (*_, kw) in enumerate(params)]

    flat = [t for x, wt, b, _ in params for t in (x, wt, b)]
    backend = vfuse.backend(strict=True)
    got = torch.compile(convs, backend=backend)(*flat)
    want = convs(*flat)
    grads = [torch.randn_like(y) for y in want]
    got_grads = torch.autograd.grad(got, flat, grads)
    want_grads = torch.autograd.grad(want, flat, grads)
    for i, (a, b) in enumerate(zip(got_grads, want_grads, strict=True)):
        assert a.shape == b.shape, (CASES[i // 3], i % 3)
        _close(a, b)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats


MASKS = [(True, False, False), (False, True, False), (False, False, True), (True, True, False), (False, True, True)]


def test_output_mask_computes_only_the_asked_gradients() -> None:
    """Direct calls (one graph): Nones where the mask says so, eager's values elsewhere."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    x, w = torch.randn(2, 4, 9, 7), torch.randn(6, 2, 3, 3)
    go = torch.randn(2, 6, 4, 3)  # stride 2, padding 0: (9 - 3) % 2 = 0, (7 - 3) % 2 = 0

    def calls(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> list:
        return [aten.convolution_backward(go, x, w, [6], [2, 2], [0, 0], [1, 1], False, [0, 0], 2, m) for m in MASKS]

    backend = vfuse.backend(strict=True)
    got = torch.compile(calls, backend=backend)(go, x, w)
    want = calls(go, x, w)
    for m, gs, ws in zip(MASKS, got, want, strict=True):
        for asked, a, b in zip(m, gs, ws, strict=True):
            assert (a is None) == (not asked), m
            if asked:
                _close(a, b)
    assert not backend.stats["fallbacks"], backend.stats


def test_frozen_weight_and_no_bias_in_a_module() -> None:
    """nn.Conv2d + BN + ReLU training step with the conv weight frozen: only grad_input (and the
    BN parameters'), through the input that requires grad."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=False)
    model = torch.nn.Sequential(conv, torch.nn.BatchNorm2d(5), torch.nn.ReLU())
    model[0].weight.requires_grad_(False)
    x = torch.randn(1, 3, 7, 9, requires_grad=True)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(model, backend=backend)
    got = compiled(x)
    g = torch.randn_like(got)
    (gx,) = torch.autograd.grad(got, x, g)
    (wx,) = torch.autograd.grad(model(x), x, g)
    _close(gx, wx)
    assert not backend.stats["fallbacks"], backend.stats


def test_weight_and_input_gradients_are_templates() -> None:
    """The report of a convolution_backward: grad_input a conv template, grad_weight (a 3x3 output
    plane) the folded weight-gradient template (one GEMM over all images, schedule/conv_fold.py)
    chosen by the cost model over torch's conv2d, no torch call; grad_bias a native reduction."""
    x, w, go = torch.randn(4, 32, 28, 28), torch.randn(32, 32, 3, 3), torch.randn(4, 32, 28, 28)

    def grads(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple:
        return aten.convolution_backward(go, x, w, [32], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True] * 3)

    kernels = vfuse.explain(grads, go, x, w).kernels
    assert sum(k.runs is RunKind.TEMPLATE for k in kernels) == 2
    assert not [k for k in kernels if k.runs is RunKind.TORCH]


# (N, C, H, W, Cout, kernel, stride, padding): weight gradients through the folded template
# (and, where the output plane is not small under grad_output's, the per-image conv)
WGRAD_CASES = [
    (1, 7, 9, 9, 5, 3, 1, 1),  # batch 1, prime channels
    (3, 5, 8, 8, 11, 3, 2, 1),  # stride 2, padding 1
    (2, 13, 10, 11, 3, 3, 2, 0),  # stride 2, padding 0, non-square
    (2, 3, 1, 1, 4, 3, 1, 1),  # 1x1 spatial: grad_output 1x1, a 3x3 plane (per image)
    (1, 2, 12, 12, 17, 5, 1, 2),  # 5x5
    (2, 3, 15, 15, 8, 7, 2, 3),  # a stem: 7x7 stride 2 over 3 channels
    (1, 2, 2, 3, 3, 3, 2, 3),  # padding past the taps' reach: rows of zeros only
]


def test_weight_gradients_match_eager() -> None:
    torch.manual_seed(3)
    for n, c, h, w, co, k, s, p in WGRAD_CASES:
        x, wt = torch.randn(n, c, h, w), torch.randn(co, c, k, k)
        go = torch.randn_like(F.conv2d(x, wt, None, s, p))

        def grad_w(go: torch.Tensor, x: torch.Tensor, wt: torch.Tensor, s: int = s, p: int = p) -> torch.Tensor:
            return aten.convolution_backward(go, x, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
                                             [False, True, False])[1]  # fmt: skip

        got = vfuse.compile(grad_w, (go, x, wt), strict=True)(go, x, wt)
        _close(got, grad_w(go, x, wt))


def _random_geometry(rng: random.Random) -> tuple:
    while True:
        g, cg, og = rng.choice([1, 1, 2, 3]), rng.randint(1, 3), rng.randint(1, 3)
        k, s = (rng.randint(1, 5), rng.randint(1, 5)), (rng.randint(1, 4), rng.randint(1, 4))
        d, p = (rng.randint(1, 3), rng.randint(1, 3)), (rng.randint(0, 4), rng.randint(0, 4))
        n, h, w = rng.randint(1, 2), rng.randint(1, 12), rng.randint(1, 12)
        if all(hw + 2 * pp >= dd * (kk - 1) + 1 for hw, pp, dd, kk in zip((h, w), p, d, k, strict=True)):
            return g, cg, og, k, s, d, p, n, h, w


def _backward_of(s: tuple, p: tuple, d: tuple, g: int):
    def grads(go: torch.Tensor, x: torch.Tensor, wt: torch.Tensor) -> tuple:
        return aten.convolution_backward(go, x, wt, [1], list(s), list(p), list(d), False, [0, 0], g, [True] * 3)

    return grads


def test_lowering_is_exact_over_random_geometries() -> None:
    """The lowered IR (reference executor, fp64: no template, no rounding to hide behind) against
    eager over random strides, paddings (past the kernel too), dilations, groups and sizes."""
    rng = random.Random(0)
    for _ in range(40):
        g, cg, og, k, s, d, p, n, h, w = geo = _random_geometry(rng)
        x, wt = torch.randn(n, g * cg, h, w, dtype=torch.float64), torch.randn(g * og, cg, *k, dtype=torch.float64)
        go = torch.randn_like(F.conv2d(x, wt, None, s, p, d, g))

        grads = _backward_of(s, p, d, g)
        graph = lower(trace_aten(grads, (go, x, wt)), Context())
        assert not any(node.op is Op.OPAQUE for node in graph.nodes), geo
        for a, b in zip(run(graph, [go, x, wt]), grads(go, x, wt), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m, geo=geo: f"{geo}: {m}")


def test_pointwise_weight_gradient_is_one_gemm() -> None:
    """A 1x1 kernel's weight gradient is one MATMUL over (N, Ho, Wo), not a swapped CONV2D, exact
    (fp64 reference executor) over strides, paddings past the kernel and prime sizes."""
    torch.manual_seed(3)
    for n, c, h, w, co, s, p in [
        (2, 5, 7, 11, 3, 1, 0),
        (1, 3, 9, 5, 4, 2, 0),
        (3, 2, 7, 7, 5, 3, 1),
        (1, 4, 5, 6, 2, 2, 2),
    ]:
        x, wt = torch.randn(n, c, h, w, dtype=torch.float64), torch.randn(co, c, 1, 1, dtype=torch.float64)
        go = torch.randn_like(F.conv2d(x, wt, None, s, p))
        grads = _backward_of((s, s), (p, p), (1, 1), 1)
        graph = lower(trace_aten(grads, (go, x, wt)), Context())
        assert sum(node.op is Op.MATMUL for node in graph.nodes) == 1, (s, p)
        torch.testing.assert_close(run(graph, [go, x, wt])[1], grads(go, x, wt)[1], rtol=1e-12, atol=1e-12)
